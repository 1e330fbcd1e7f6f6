use clap::Parser;

/// The daemons allocate and free small buffers at a high rate on many threads (decoded
/// batches, acknowledgements, live state): mimalloc's per-thread heaps do that for a fraction
/// of the C library allocator's cost, which spent a fifth of the collector's ingest threads'
/// time in `malloc`/`free` at 65,536 ranks (docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    commscope_cli::cli::main_with(commscope_cli::cli::Cli::parse())
}
