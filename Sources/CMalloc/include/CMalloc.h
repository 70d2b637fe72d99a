#ifndef ATTEST_CMALLOC_H
#define ATTEST_CMALLOC_H
/* glibc's allocator tuning (malloc.h is not in Swift's Glibc module). */
#include <stdlib.h> /* defines __GLIBC__ on glibc */
#ifdef __GLIBC__
#include <malloc.h>
/* Keep up to `trim` bytes free at the top of each arena, and map blocks of `mmap_min` bytes or
   more on their own: 0 on success. */
static inline int attest_malloc_keep_free(int trim, int mmap_min) {
    return (mallopt(M_TRIM_THRESHOLD, trim) == 1 && mallopt(M_MMAP_THRESHOLD, mmap_min) == 1) ? 0 : -1;
}
#else
static inline int attest_malloc_keep_free(int trim, int mmap_min) { (void)trim; (void)mmap_min; return 0; }
#endif
#endif
