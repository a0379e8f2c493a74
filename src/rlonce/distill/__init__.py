"""On-policy distillation from per-source teachers: MOPD2 (seed 001; docs/distillation.md).

    student samples ─► (prefix turns replayed, never trained) ─► teacher scores the student's
    tokens once ─► rows carry teacher log-probs ─► each trained token's advantage gains
    kl_weight · (log π_teacher − log π_student) ─► the RL trainer's objective

``teachers`` loads and runs a teacher; ``prefixes`` gives each sibling of a group its history
prefix (none, a scripted-expert demonstration's, the teacher's own rollout's); ``executor``
wraps a source's executor with both. The advantage itself is step 8b of the learning signal
(``rlonce.algo.signal.distill_advantages``), so rows, ledger, audit and viewer are RL's.
"""
