"""``rlonce.dist``: scale-out on Ray — engine actors, harness-pool actors, a trainer actor, and the executor the
orchestrator drives — the same orchestrator, judge, trainer and engine code as the local run.

    driver (control plane: Job, Orchestrator, ledger; metadata only)
      ├─ RayExecutor.run_group ──► HarnessPool actor (many sequences on one event loop; sandboxes are
      │                            subprocesses; ``[grading]``'s model graders grade each group there;
      │                            judging runs on a background thread)
      │                              └─ RemoteEngine ──► EngineActor (TorchEngine, or any Engine factory)
      │      ◄── Judged (ledger entry, statistics, grading counts, sequences without contexts)   [return 1]
      │          payload = (sequences, TrainingRows) left in the object store    [return 2]
      └─ RayCluster.train(payload refs) ──► TrainerActor fetches the rows, steps, puts the weights
         into the object store once (``publish``); engines load them by version between tokens.

**Ownership.** A pool's payload is the second return value of the driver's call, so the driver
owns it and it outlives the pool that made it; only the trainer (and a checkpoint writer)
fetches it. Ray inlines values under 100 KiB into the reply instead of the object store.

**Faults.** Pools and engines are restarted by Ray (``ray.max_restarts``); a call that was in
flight on a dead actor fails, and its group becomes ``infra`` with category ``worker_lost``
(``call_timeout`` when the call outlived ``ray.group_timeout_s``) — the orchestrator books it
and dispatches on. Engine requests from a pool time out after ``ray.call_timeout_s`` and become
``engine_error``. A restarted engine loads the trainer's latest published weights before it
serves, so it never generates with a version the run has left behind.
"""
