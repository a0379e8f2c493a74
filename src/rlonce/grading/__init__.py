"""Model graders: judges (``judge``), what they are asked (``verdicts``), the scripted judge, agentic
graders, and the per-group grader a run calls (``graders``). docs/grading.md."""
