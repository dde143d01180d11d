//! A small, sans-I/O client for Jupyter kernels, for husk's in-sandbox agent.
//!
//! The agent is a single-threaded, poll(2)-driven PID 1 without an async runtime, so the usual
//! Rust Jupyter clients (built on tokio and async ZeroMQ) do not fit. The codecs do no I/O at
//! all: [`zmtp`] turns bytes into ZeroMQ frames and back, [`wire`] turns frames into signed
//! Jupyter messages and back, and [`connection`] writes the connection file a kernel is started
//! with. [`client`] drives them over non-blocking sockets for a caller's poll(2) loop, which
//! keeps the clock and the process.
#![forbid(unsafe_code)]

pub mod client;
pub mod connection;
pub mod wire;
pub mod zmtp;
