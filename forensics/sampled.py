"""A down-sampled export's bucket excursions, in words (shared by the W&B chart-export
importer, which measures them into ``Run.metadata["sampled_export"]``, and the diagnosis,
whose verdict says what the sampled points leave out)."""

from __future__ import annotations

from typing import Any


def excursion_text(w: dict[str, Any]) -> str:
    """``the chart's bucket maxima reach 4 at step 6,000 (3.9x the sampled 1.02 there)``
    (or the minima, for a bucket whose lowest point lies furthest below its sample)."""
    from forensics.evidence.trend_utils import num

    if w["upper"]:
        return (
            f"the chart's bucket maxima reach {num(w['bound'])} at step {w['step']:,} "
            f"({w['ratio']:.1f}x the sampled {num(w['value'])} there)"
        )
    return (
        f"the chart's bucket minima fall to {num(w['bound'])} at step {w['step']:,} "
        f"(the sampled {num(w['value'])} there is {w['ratio']:.1f}x that)"
    )
