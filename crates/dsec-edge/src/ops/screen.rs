//! A full VM's screen for computer-use agents: screenshots, keyboard and
//! mouse. Like every other request these check the owner, resume a paused
//! sandbox first and count as activity; a sandbox without a screen (a
//! container, a microVM) gets `NoScreen` (409), malformed input `Invalid`
//! (400) before anything reaches the VM.

use std::sync::Arc;

use crate::backends::fullvm::screen::Screenshot;
use crate::backends::fullvm::{input, FullVmBackend};
use crate::edge::Edge;
use crate::error::EdgeError;
use crate::model::{BackendKind, Caller};

/// One input action.
#[derive(Debug, Clone, PartialEq)]
pub enum ScreenInput {
    /// Key combos pressed one after the other (`ctrl-alt-delete`, `ret`).
    Keys(Vec<String>),
    /// Text typed on a US layout.
    Text(String),
    /// Pointer to pixel (x, y).
    Move { x: u32, y: u32 },
    /// A click, at (x, y) if given (else where the pointer is).
    Click { at: Option<(u32, u32)>, button: String, double: bool },
}

impl Edge {
    /// The backend holding `id`'s screen, once the sandbox runs.
    async fn screen_of(&self, caller: &Caller, id: &str) -> Result<Arc<FullVmBackend>, EdgeError> {
        let entry = self.entry(caller, id)?;
        let kind = entry.record().spec.backend;
        if kind != BackendKind::Vm {
            return Err(EdgeError::NoScreen(format!(
                "sandbox {id} runs as a {} and has no screen; screenshots and input need backend \"vm\"",
                match kind {
                    BackendKind::Container => "container",
                    BackendKind::Microvm => "microVM",
                    BackendKind::Vm => "VM",
                    BackendKind::Fncall => "FnCall runner",
                }
            )));
        }
        self.running(caller, id).await?;
        match &self.inner.backends.fullvm {
            Ok(vm) => Ok(vm.clone()),
            Err(why) => Err(EdgeError::UnsupportedBackend(format!("full VMs are not available on this node: {why}"))),
        }
    }

    /// The VM's screen as PNG.
    pub async fn screenshot(&self, caller: &Caller, id: &str) -> Result<Screenshot, EdgeError> {
        let vm = self.screen_of(caller, id).await?;
        let _activity = self.entry(caller, id)?.begin();
        vm.screenshot(id).await
    }

    /// Sends keyboard or mouse input to the VM.
    pub async fn screen_input(&self, caller: &Caller, id: &str, action: ScreenInput) -> Result<(), EdgeError> {
        // Input is checked first: a bad key is the caller's error whatever
        // the sandbox's state.
        let mut events = match &action {
            ScreenInput::Keys(keys) => {
                if keys.is_empty() || keys.len() > input::MAX_KEYS {
                    return Err(EdgeError::Invalid(format!("keys must name 1 to {} key combos", input::MAX_KEYS)));
                }
                let combos = keys.iter().map(|k| input::parse_combo(k)).collect::<Result<Vec<_>, _>>().map_err(EdgeError::Invalid)?;
                combos.iter().flat_map(input::combo_events).collect()
            }
            ScreenInput::Text(text) => {
                if text.is_empty() {
                    return Err(EdgeError::Invalid("text must not be empty".into()));
                }
                input::text_events(text).map_err(EdgeError::Invalid)?
            }
            ScreenInput::Move { .. } => Vec::new(),
            ScreenInput::Click { button, double, .. } => input::click_events(input::button(button).map_err(EdgeError::Invalid)?, *double),
        };
        let vm = self.screen_of(caller, id).await?;
        let _activity = self.entry(caller, id)?.begin();
        let target = match action {
            ScreenInput::Move { x, y } => Some((x, y)),
            ScreenInput::Click { at, .. } => at,
            _ => None,
        };
        if let Some((x, y)) = target {
            // Pixels are relative to the screen as it is now (its mode can
            // change at any time: text console, a desktop's resolution).
            let shot = vm.screenshot(id).await?;
            let mut moves = input::move_events(x, y, shot.width, shot.height).map_err(EdgeError::Invalid)?;
            moves.append(&mut events);
            events = moves;
        }
        vm.send_input(id, events).await
    }
}
