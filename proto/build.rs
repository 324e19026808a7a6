//! Generates the gRPC client and server from `enclave.proto` (needs `protoc`, installed by `make`).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=enclave.proto");
    tonic_build::configure().compile_protos(&["enclave.proto"], &["."])?;
    Ok(())
}
