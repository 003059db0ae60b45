"""The checkpoints a trainer's stdout says it saved, with their steps.

A log that says where it saved is evidence of the checkpoints the rollback advice can go back
to, wherever the trainer wrote them:

- Megatron-LM: ``successfully saved checkpoint from iteration     500 to /ckpt`` (``at
  iteration`` in older versions);
- HF Trainer: ``Saving model checkpoint to out/checkpoint-500``;
- DeepSpeed: ``[Torch] Checkpoint global_step500 is ready now!``;
- llm.c: ``Writing model to log124M/model_00005000.bin`` (and ``Writing state to ...``);
- Lightning's ModelCheckpoint: ``... saving model to '/ckpt/epoch=0-step=500.ckpt' ...``.

Each phrase is found with a plain substring search (fast on a log of millions of lines) and
only the rest of its line is matched.
"""

from __future__ import annotations

import re

from forensics.importers.text.engine import Text

# The phrase searched for and the rest of the line's pattern up to the step, by the log
# family that prints it (a search costs about 0.1 s on a 360 MB log: only the families
# found in the log are searched for; a generic log for all).
_PHRASES = {
    "megatron": ((b"saved checkpoint ", rb"(?:from|at) iteration\s+(\d+)"),),
    "deepspeed": (
        (b"Checkpoint global_step", rb"(\d+) is ready"),
        (b"Saving model checkpoint to ", rb"\S*?checkpoint-(\d+)"),
    ),
    "llmc": (
        (b"Writing model to ", rb"\S*?model_(\d+)\.bin"),
        (b"Writing state to ", rb"\S*?state_(\d+)_\d+\.bin"),
    ),
    "hf_stdout": ((b"Saving model checkpoint to ", rb"\S*?checkpoint-(\d+)"),),
    "generic": (
        (b"Saving model checkpoint to ", rb"\S*?checkpoint-(\d+)"),
        (b"saving model to ", rb"'?\S*?step=(\d+)[^/\s]*\.ckpt"),
    ),
}
_SAVES = {
    family: tuple((phrase, re.compile(re.escape(phrase) + rest)) for phrase, rest in phrases)
    for family, phrases in _PHRASES.items()
}
_MOST = 100_000  # saves read at most (a log of a million of them is not a checkpoint list)


def saved_steps(raw: Text, families: list[str]) -> list[int]:
    """The steps of the checkpoints the log says were saved (sorted, each once), by the
    phrases of the log's ``families``."""
    steps: set[int] = set()
    # (each phrase once: HF's save line is both the hf_stdout family's and the generic one's)
    searched = {phrase: pattern for f in families for phrase, pattern in _SAVES.get(f, ())}
    for phrase, pattern in searched.items():
        at = raw.find(phrase)
        while at >= 0 and len(steps) < _MOST:
            end = raw.find(b"\n", at)  # (every pattern begins with its phrase)
            m = pattern.match(raw[at : end if end >= 0 else len(raw)])
            if m:
                steps.add(int(m.group(1)))
            at = raw.find(phrase, at + len(phrase))
    return sorted(steps)
