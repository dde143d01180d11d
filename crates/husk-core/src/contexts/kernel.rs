//! One kernel as the server sees it: its state (starting, ready, dead) and the routing of its
//! events to the execution that is running.
//!
//! A task per kernel reads the agent's events for it ([`crate::agent::KernelStream`]) and must
//! never wait long: the agent connection's reader waits for it (back-pressure), so a slow
//! client of one execution slows only that sandbox's agent traffic, as with process output.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use husk_proto::{ExecEvent, KernelEvent, Request};
use tokio::sync::{mpsc, watch};

use super::ContextError;
use crate::agent::{AgentClient, KernelStream};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Starting,
    Ready,
    /// Why it ended (the agent's message, or "the sandbox is gone").
    Dead(String),
}

/// What an execution hears from its kernel.
#[derive(Debug)]
pub enum KernelOut {
    Event(ExecEvent),
    Dead(String),
}

/// The running execution's id and where its events go.
type Route = Arc<Mutex<Option<(u64, mpsc::Sender<KernelOut>)>>>;

pub struct Kernel {
    pub id: u32,
    agent: AgentClient,
    state: watch::Receiver<State>,
    current: Route,
    /// Killed because an interrupted execution did not end ([`Kernel::kill_unresponsive`]).
    unresponsive: std::sync::atomic::AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Kernel {
    /// Starts routing `stream`'s events.
    pub fn spawn(id: u32, agent: AgentClient, stream: KernelStream) -> Arc<Kernel> {
        Self::spawn_in(id, agent, stream, State::Starting)
    }

    /// [`Kernel::spawn`] for a kernel that runs and is ready already (subscribed to again by
    /// a restarted server).
    pub fn spawn_ready(id: u32, agent: AgentClient, stream: KernelStream) -> Arc<Kernel> {
        Self::spawn_in(id, agent, stream, State::Ready)
    }

    fn spawn_in(
        id: u32,
        agent: AgentClient,
        mut stream: KernelStream,
        first: State,
    ) -> Arc<Kernel> {
        let (state_tx, state) = watch::channel(first);
        let current: Route = Arc::default();
        let routes = current.clone();
        tokio::spawn(async move {
            let why = loop {
                match stream.next().await {
                    None => break "the sandbox is gone".to_string(),
                    Some(KernelEvent::Ready { .. }) => {
                        state_tx.send_replace(State::Ready);
                    }
                    Some(KernelEvent::Dead { message }) => break message,
                    Some(KernelEvent::Exec { exec, event }) => {
                        let tx = match &*lock(&routes) {
                            Some((id, tx)) if *id == exec => Some(tx.clone()),
                            _ => None,
                        };
                        if let Some(tx) = tx {
                            // The execution task always drains (it never waits on its client
                            // while holding events), so this wait is short.
                            let _ = tx.send(KernelOut::Event(event)).await;
                        }
                    }
                }
            };
            state_tx.send_replace(State::Dead(why.clone()));
            let tx = lock(&routes).take();
            if let Some((_, tx)) = tx {
                let _ = tx.send(KernelOut::Dead(why)).await;
            }
        });
        Arc::new(Kernel {
            id,
            agent,
            state,
            current,
            unresponsive: Default::default(),
        })
    }

    pub fn state(&self) -> State {
        self.state.borrow().clone()
    }

    /// Waits until the kernel is ready; its death or the timeout is an error.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), ContextError> {
        let mut rx = self.state.clone();
        let waited = tokio::time::timeout(timeout, async {
            loop {
                match &*rx.borrow_and_update() {
                    State::Ready => return Ok(()),
                    State::Dead(why) => {
                        return Err(ContextError::Kernel(format!(
                            "the kernel did not start: {why}"
                        )))
                    }
                    State::Starting => {}
                }
                if rx.changed().await.is_err() {
                    return Err(ContextError::Gone);
                }
            }
        })
        .await;
        match waited {
            Ok(r) => r,
            Err(_) => {
                self.stop().await;
                Err(ContextError::Kernel(format!(
                    "the kernel did not start within {} s",
                    timeout.as_secs()
                )))
            }
        }
    }

    /// Routes execution `exec`'s events to a new channel (replacing any earlier route).
    pub fn route(&self, exec: u64) -> mpsc::Receiver<KernelOut> {
        let (tx, rx) = mpsc::channel(64);
        *lock(&self.current) = Some((exec, tx));
        rx
    }

    pub fn unroute(&self, exec: u64) {
        let mut cur = lock(&self.current);
        if matches!(&*cur, Some((id, _)) if *id == exec) {
            *cur = None;
        }
    }

    pub fn agent(&self) -> &AgentClient {
        &self.agent
    }

    pub async fn interrupt(&self) {
        let _ = self
            .agent
            .call(Request::KernelInterrupt { kernel: self.id })
            .await;
    }

    /// Kills a kernel that did not end an interrupted execution: the context gets a fresh
    /// kernel at its next execution ([`Kernel::was_unresponsive`]).
    pub async fn kill_unresponsive(&self) {
        self.unresponsive
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.stop().await;
    }

    /// Whether the kernel was killed for not ending an interrupted execution.
    pub fn was_unresponsive(&self) -> bool {
        self.unresponsive.load(std::sync::atomic::Ordering::Relaxed)
            && matches!(self.state(), State::Dead(_))
    }

    /// Kills the kernel (idempotent; a dead kernel's id is unknown to the agent).
    pub async fn stop(&self) {
        if matches!(self.state(), State::Dead(_)) {
            return;
        }
        let _ = self
            .agent
            .call(Request::KernelStop { kernel: self.id })
            .await;
    }
}
