/* link-time stand-in for the driver's libcuda.so.1 (this host has no driver); never loaded */
int cuGetErrorName(void) { return 0; }
int cuTensorMapEncodeTiled(void) { return 0; }
int cuGetErrorString(void) { return 0; }
int cuTensorMapEncodeIm2col(void) { return 0; }
int cuLaunchKernel(void) { return 0; }
int cuLaunchKernelEx(void) { return 0; }
int cuModuleGetFunction(void) { return 0; }
int cuFuncSetAttribute(void) { return 0; }
int cuGetProcAddress(void) { return 0; }
