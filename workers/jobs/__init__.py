"""One module per job kind and stage; plain functions, no Celery (workers/tasks.py wraps them).

    graph      the graph job: the staged compile's decomposition, or the whole compile
    decompose  decomposition: AOTAutograd's forward and backward graphs, then the lowering is sent
    lower      lowering: Inductor with C++ builds deferred, kernel builds streamed out, fan-out
    build      kernel generation: C++ kernel builds, the fleet-wide kernel cache
    assemble   assembly: the signed manifest from the plan and the cached binaries
    whole      the whole-graph compile, in one job
    export     an AOTInductor package
    triton     a Triton kernel for a named target (the CompileKernel RPC)
    sending    how stage jobs send each other, and claim kernels
"""
