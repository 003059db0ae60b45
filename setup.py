"""The compiled parts of forensics, all optional: the trend windows' slope kernel
(forensics/evidence/_slopes.c), the rolling rank filter (forensics/evidence/_rolling.c), the
event file reader's grouping of rows by tag (forensics/importers/_group.c), the Megatron
log's iteration lines (forensics/importers/text/_megatron.c) and the plain lines of a JSONL
log (forensics/importers/_jsonl.c). Without a C compiler the install still succeeds and the
same numbers come from numpy (forensics.evidence.order_stats, forensics.importers.tfevents),
scipy (forensics.evidence.rolling) and polars (forensics.importers.text.megatron,
forensics.importers.jsonl_blocks)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("forensics.evidence._slopes", ["forensics/evidence/_slopes.c"], optional=True),
        Extension("forensics.evidence._rolling", ["forensics/evidence/_rolling.c"], optional=True),
        Extension("forensics.importers._group", ["forensics/importers/_group.c"], optional=True),
        Extension("forensics.importers._tfscan", ["forensics/importers/_tfscan.c"], optional=True),
        Extension(
            "forensics.importers._jsonl",
            ["forensics/importers/_jsonl.c"],
            depends=["forensics/_decimal.h"],
            optional=True,
        ),
        Extension(
            "forensics.importers.text._megatron",
            ["forensics/importers/text/_megatron.c"],
            depends=["forensics/_decimal.h"],
            optional=True,
        ),
    ]
)
