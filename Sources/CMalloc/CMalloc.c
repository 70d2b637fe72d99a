/* Header-only: see include/CMalloc.h. */
