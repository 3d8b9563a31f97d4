"""Distributed and engine concerns, below the trainer (:mod:`mathrl.train` builds on them, nothing here
imports it): the process group and every collective (:mod:`~mathrl.dist.collectives`), DeepSpeed engines
(:mod:`~mathrl.dist.engines`) and their JSON configs (:mod:`~mathrl.dist.ds_json`), and checkpoint folders
on disk (:mod:`~mathrl.dist.checkpoint_io`)."""
