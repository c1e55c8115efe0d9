/* The Swift bindings' C header (MpushSdkFFI.h) against the built library,
 * with gcc since no Swift toolchain exists here: it must compile as C (the
 * Clang-only nullability qualifiers defined away), every declaration must
 * link against libmpush_sdk_mobile.so, and the library must answer the
 * header's contract version and checksums (what Swift checks at load time). */
#define _Nonnull
#define _Nullable
#define _Null_unspecified
#include "MpushSdkFFI.h"
#include <stdio.h>

int main(void) {
    uint32_t contract = ffi_mpush_sdk_mobile_uniffi_contract_version();
    uint16_t shutdown = uniffi_mpush_sdk_mobile_checksum_method_pushclient_shutdown();
    uint16_t version = uniffi_mpush_sdk_mobile_checksum_func_sdk_version();
    printf("contract version %u, checksums shutdown=%u sdk_version=%u\n", contract, shutdown, version);
    return contract == 0 ? 1 : 0;
}
