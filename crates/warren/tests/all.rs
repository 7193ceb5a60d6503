//! Integration tests of warren through the real binary and its real HTTP server.

mod suite;
