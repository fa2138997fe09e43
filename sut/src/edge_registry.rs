//! The registry of every declared edge state ([`crate::edge`]), machine by machine.
//!
//! Apart from [`crate::edge`] so that the counter the machines import depends on none of them:
//! each machine declares its edge states next to the code that reaches them and imports
//! `edge::reached`; only this file imports every machine's list.

use crate::edge::{Edge, Machine};

/// Every declared edge state, machine by machine.
pub fn all() -> impl Iterator<Item = &'static Edge> {
    crate::segment::EDGES
        .iter()
        .chain(crate::snowflake::EDGES)
        .chain(crate::token::EDGES)
        .chain(crate::lottery::coordinator::EDGES)
        .chain(crate::lottery::participant::EDGES)
        .chain(crate::lottery::wheel::EDGES)
}

/// The declared edge state named `name`.
#[must_use]
pub fn find(name: &str) -> Option<&'static Edge> {
    all().find(|e| e.name == name)
}

impl Machine {
    /// This machine's edge states.
    pub fn edges(self) -> impl Iterator<Item = &'static Edge> {
        all().filter(move |e| e.machine == self)
    }
}
