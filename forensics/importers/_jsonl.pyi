# The compiled reading of plain JSONL blocks (forensics/importers/_jsonl.c): see
# jsonl_blocks.Parser._flat.

def scan(buf: bytes | memoryview, /) -> tuple[int, int, list[str], bytes, bytes, bytes] | None: ...
