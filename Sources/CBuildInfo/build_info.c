// The version and commit the shipped binaries print (`--version`) and log at start. Both headers
// are written by scripts/embed-version.sh, which every make target that builds runs: version.h
// from VERSION (committed; a test checks it against VERSION), commit.h from git (not committed:
// without it, the commit is "unknown").
#include "build_info.h"
#include "version.h"
#if __has_include("commit.h")
#include "commit.h"
#endif
#ifndef ATTEST_COMMIT
#define ATTEST_COMMIT "unknown"
#endif

const char *attest_build_version(void) { return ATTEST_VERSION; }
const char *attest_build_commit(void) { return ATTEST_COMMIT; }
