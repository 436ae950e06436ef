//! A source driven by a test: events are pushed by hand, commands are recorded.
//!
//! The pipeline cannot tell it from Kafka, so rewinds, fences, dead-letter dedupe,
//! routing and revocations are tested in-process, without a broker.

use std::sync::{Arc, Mutex};

use crossbeam_channel::{Receiver, Sender};

use super::{Assignment, Source, SourceCommand, SourceEvent};
use crate::record::{Message, TopicPartition};

/// The test's end of a [`ScriptedSource`].
#[derive(Clone)]
pub struct Script {
    events: Sender<SourceEvent>,
    commands: Arc<Mutex<Vec<SourceCommand>>>,
}

/// A [`Source`] whose events come from a [`Script`].
pub struct ScriptedSource {
    events: Receiver<SourceEvent>,
    commands: Arc<Mutex<Vec<SourceCommand>>>,
}

/// A scripted source and the handle that drives it.
pub fn scripted() -> (ScriptedSource, Script) {
    let (tx, rx) = crossbeam_channel::unbounded();
    let commands = Arc::new(Mutex::new(Vec::new()));
    (
        ScriptedSource {
            events: rx,
            commands: commands.clone(),
        },
        Script {
            events: tx,
            commands,
        },
    )
}

impl Script {
    /// Delivers an event.
    pub fn send(&self, event: SourceEvent) {
        let _ = self.events.send(event);
    }

    /// Assigns partitions at the given positions (`stored` per table of the pipeline).
    pub fn assign(&self, assignments: Vec<Assignment>) {
        self.send(SourceEvent::Assigned(assignments));
    }

    /// Revokes partitions.
    pub fn revoke(&self, tps: Vec<TopicPartition>) {
        self.send(SourceEvent::Revoked(tps));
    }

    /// Delivers messages in the current epoch (the last one a seek asked for).
    pub fn records(&self, messages: Vec<Message>) {
        let epoch = self.epoch();
        self.send(SourceEvent::Records(epoch, messages));
    }

    /// The epoch of the last seek (0 before any).
    pub fn epoch(&self) -> u64 {
        self.commands
            .lock()
            .expect("commands")
            .iter()
            .rev()
            .find_map(|c| match c {
                SourceCommand::Seek { epoch, .. } => Some(*epoch),
                _ => None,
            })
            .unwrap_or(0)
    }

    /// Every command the pipeline sent so far.
    pub fn commands(&self) -> Vec<SourceCommand> {
        self.commands.lock().expect("commands").clone()
    }
}

impl Source for ScriptedSource {
    fn events(&self) -> &Receiver<SourceEvent> {
        &self.events
    }

    fn command(&self, command: SourceCommand) {
        self.commands.lock().expect("commands").push(command);
    }

    fn shutdown(self: Box<Self>) {}
}

impl Script {
    /// Events delivered but not yet taken by the pipeline.
    pub fn pending(&self) -> usize {
        self.events.len()
    }
}
