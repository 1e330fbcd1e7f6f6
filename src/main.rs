use clap::Parser;

fn main() -> std::process::ExitCode {
    commscope_cli::cli::main_with(commscope_cli::cli::Cli::parse())
}
