//! The commscope live terminal UI (ratatui), talking to the collector's query API.
//!
//! Nothing is implemented yet; `commscope tui` does not exist until it is.
#![forbid(unsafe_code)]
