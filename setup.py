"""The compiled parts of forensics, both optional: the trend windows' slope kernel
(forensics/evidence/_slopes.c) and the rolling rank filter (forensics/evidence/_rolling.c).
Without a C compiler the install still succeeds and the same numbers come from numpy
(forensics.evidence.order_stats) and scipy (forensics.evidence.rolling)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("forensics.evidence._slopes", ["forensics/evidence/_slopes.c"], optional=True),
        Extension("forensics.evidence._rolling", ["forensics/evidence/_rolling.c"], optional=True),
    ]
)
