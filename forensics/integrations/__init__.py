"""In-process watching for trainers: callbacks that run the ``forensics analyze`` engine on
what the trainer logs (:mod:`forensics.integrations.hf` for the Hugging Face Trainer,
:mod:`forensics.integrations.lightning` for Lightning).

The trainers are imported only by those two modules, never from here.
"""
