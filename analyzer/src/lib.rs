//! The commscope analyzer: detectors (slow rank, hang, mismatch, …) with a streaming and a batch
//! driver, and importers for foreign trace formats.
//!
//! Nothing is implemented yet; `commscope analyze` does not exist until it is.
#![forbid(unsafe_code)]
