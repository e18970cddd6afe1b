/* Preloaded in front of libxcuda.so to check that dlsym(RTLD_NEXT, ...) still
 * searches from the caller: the harness must find this definition first. */
__attribute__((visibility("default"))) int xcfake_probe(void);
int xcfake_probe(void)
{
    return 1;
}
