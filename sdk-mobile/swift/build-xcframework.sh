#!/usr/bin/env bash
# Builds MpushSdkFFI.xcframework for the Swift package this script sits in
# (target/mobile/swift/MpushSdk/, made by ./scripts/build-mobile). macOS
# with Xcode and rustup only: iOS devices, the iOS simulators (arm64 and
# x86_64, merged with lipo) and macOS (arm64 and x86_64), release builds of
# the static library.
#   ./build-xcframework.sh [path/to/mpush/checkout]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=${1:-$(cd "$here/../../../.." && pwd)}
[ "$(uname -s)" = Darwin ] || { echo "build-xcframework.sh needs macOS with Xcode" >&2; exit 1; }
command -v xcodebuild >/dev/null || { echo "xcodebuild not found: install Xcode" >&2; exit 1; }
targets=(aarch64-apple-ios aarch64-apple-ios-sim x86_64-apple-ios aarch64-apple-darwin x86_64-apple-darwin)
rustup target add "${targets[@]}"
for t in "${targets[@]}"; do
    cargo build --manifest-path "$repo/Cargo.toml" -p mpush-sdk-mobile --release --target "$t"
done
lib=libmpush_sdk_mobile.a
tgt="$repo/target"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/sim" "$work/mac"
lipo -create "$tgt/aarch64-apple-ios-sim/release/$lib" "$tgt/x86_64-apple-ios/release/$lib" -output "$work/sim/$lib"
lipo -create "$tgt/aarch64-apple-darwin/release/$lib" "$tgt/x86_64-apple-darwin/release/$lib" -output "$work/mac/$lib"
rm -rf "$here/MpushSdkFFI.xcframework"
xcodebuild -create-xcframework \
    -library "$tgt/aarch64-apple-ios/release/$lib" -headers "$here/headers" \
    -library "$work/sim/$lib" -headers "$here/headers" \
    -library "$work/mac/$lib" -headers "$here/headers" \
    -output "$here/MpushSdkFFI.xcframework"
echo "built $here/MpushSdkFFI.xcframework; the package in $here is ready (swift build, or add it in Xcode)"
