// swift-tools-version:5.9
// The iOS/macOS package of the mpush SDK. `./scripts/build-mobile` assembles
// it in target/mobile/swift/MpushSdk/ (this file, the generated Swift in
// Sources/MpushSdk, the C header in headers/); on macOS,
// `./build-xcframework.sh` there builds MpushSdkFFI.xcframework (the Rust
// library for iOS devices, the simulators and macOS) beside this file.
// Then add the folder as a local package in Xcode, or publish it.
import PackageDescription

let package = Package(
    name: "MpushSdk",
    platforms: [.iOS(.v15), .macOS(.v12)],
    products: [
        .library(name: "MpushSdk", targets: ["MpushSdk"]),
    ],
    targets: [
        .binaryTarget(name: "MpushSdkFFI", path: "MpushSdkFFI.xcframework"),
        .target(name: "MpushSdk", dependencies: ["MpushSdkFFI"], path: "Sources/MpushSdk"),
    ]
)
