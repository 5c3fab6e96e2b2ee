"""The structure of a run, read once and used by everything that needs a window or a step:
start-up, warm-up, steady iterations, tear-down and the kind of run (``structure``), the loops
in a GPU's operations (``loops``), NVTX iterations (``iterations``), forward passes of a
model (``forwards``), generation steps and requests (``phases``) and training phases
(``training``). The entry point is :func:`tracekit.analysis.run.structure.build_structure`
over :func:`~tracekit.analysis.run.structure.find_iterations`, as
:attr:`tracekit.diagnosis.context.Context.structure` calls them."""
