# The compiled grouping of rows (forensics/importers/_group.c): see tfevents._by_tag.
from collections.abc import Sequence
from typing import Any

def group(keys: Any, order: Any, columns: Sequence[Any], spare: Any) -> None: ...
