//! Colours that colour-blind readers tell apart: the Okabe–Ito palette for states, and a
//! viridis ramp (monotone in lightness) for heat. Heat also changes glyph with its level, so the
//! heatmap reads without colour too.

use ratatui::style::{Color, Modifier, Style};

pub const BLUE: Color = Color::Rgb(0x00, 0x72, 0xB2);
pub const SKY: Color = Color::Rgb(0x56, 0xB4, 0xE9);
pub const ORANGE: Color = Color::Rgb(0xE6, 0x9F, 0x00);
pub const VERMILLION: Color = Color::Rgb(0xD5, 0x5E, 0x00);
pub const GREEN: Color = Color::Rgb(0x00, 0x9E, 0x73);
pub const GREY: Color = Color::Rgb(0x99, 0x99, 0x99);

/// Five heat levels, cold to hot (viridis).
pub const HEAT: [Color; 5] = [
    Color::Rgb(0x44, 0x01, 0x54),
    Color::Rgb(0x3B, 0x52, 0x8B),
    Color::Rgb(0x21, 0x91, 0x8C),
    Color::Rgb(0x5E, 0xC9, 0x62),
    Color::Rgb(0xFD, 0xE7, 0x25),
];
/// The glyph of each level.
pub const GLYPH: [char; 5] = ['·', '░', '▒', '▓', '█'];

pub fn title() -> Style {
    Style::default().fg(SKY).add_modifier(Modifier::BOLD)
}

pub fn dim() -> Style {
    Style::default().fg(GREY)
}

pub fn selected() -> Style {
    Style::default().add_modifier(Modifier::REVERSED)
}

/// A job's or rank's state.
pub fn state(s: &str) -> Style {
    match s {
        "running" => Style::default().fg(BLUE),
        "finalized" | "exited" | "ended" => Style::default().fg(GREY),
        "killed" | "lost" => Style::default().fg(VERMILLION),
        _ => Style::default(),
    }
}

/// A finding by its state.
pub fn finding(state: &str) -> Style {
    if state == "open" {
        Style::default().fg(ORANGE).add_modifier(Modifier::BOLD)
    } else {
        Style::default().fg(GREY)
    }
}

/// The heat level (0..=4) of a value in [0, 1]; below a tenth is cold.
pub fn level(v: f64) -> usize {
    if v.is_nan() || v < 0.1 {
        0
    } else {
        ((v * 4.0).ceil() as usize).clamp(1, 4)
    }
}
