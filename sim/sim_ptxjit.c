/* The simulator's stand-in for the driver's libnvidia-ptxjitcompiler.so.1:
 * only its presence is modelled (sim_cuda_jit.c loads it before compiling
 * PTX); the simulator reads PTX itself (sim_ptx.c). */
__attribute__((visibility("default"))) int gpusliceSimPtxJitCompiler(void)
{
    return 1;
}
