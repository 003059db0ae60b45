"""The one compiled part of forensics, optional: the trend windows' slope kernel
(forensics/evidence/_slopes.c). Without a C compiler the install still succeeds and the
same numbers come from the numpy path (forensics.evidence.order_stats)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("forensics.evidence._slopes", ["forensics/evidence/_slopes.c"], optional=True)
    ]
)
