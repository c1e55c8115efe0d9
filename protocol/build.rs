//! Compiles `proto/mpush_v2.proto` with the pure-Rust `protox` (no `protoc` needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/mpush_v2.proto");
    let fds = protox::compile(["proto/mpush_v2.proto"], ["proto"])?;
    prost_build::Config::new().compile_fds(fds)?;
    Ok(())
}
