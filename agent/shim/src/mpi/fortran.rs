//! Fortran bindings.
