//! Loading traces for the commands that read them: every format [`commscope_import`] knows,
//! with its warnings printed the way every command prints them.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
pub use commscope_import::{JobTrace, Loaded};

/// Loads `paths`, printing one `commscope: warning: FILE: what is wrong` line per damaged,
/// unreadable or unknown file.
pub fn load(paths: &[PathBuf]) -> Result<Loaded> {
    let loaded = commscope_import::load(paths)?;
    for w in &loaded.warnings {
        eprintln!("commscope: warning: {w}");
    }
    Ok(loaded)
}

/// A command that read traces succeeds when it read a job, whatever else was damaged.
pub fn exit_code(loaded: &Loaded) -> ExitCode {
    if loaded.jobs.is_empty() {
        eprintln!("commscope: no trace could be read");
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
