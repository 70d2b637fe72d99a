#ifndef ATTEST_BUILD_INFO_H
#define ATTEST_BUILD_INFO_H

/// The release (VERSION at the repository's root) these binaries were built from.
const char *attest_build_version(void);
/// The commit they were built from (`git rev-parse HEAD`, with "-dirty" when tracked files had
/// changes), or "unknown" outside a git checkout or when built without scripts/embed-version.sh.
const char *attest_build_commit(void);

#endif
