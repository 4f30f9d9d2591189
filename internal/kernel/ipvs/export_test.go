package ipvs

// RequireVMKernel is requireVMKernel for the external tests (package
// ipvs_test) that TestKernelVM runs.
var RequireVMKernel = requireVMKernel
