//! A sandbox's screen for computer-use agents (full VMs): screenshots,
//! keyboard and mouse. Like every other request these check the owner,
//! resume a paused sandbox first and count as activity; a sandbox without
//! a screen (a container, a microVM) gets `NoScreen` (409), malformed
//! input `Invalid` (400) before anything reaches the VM.

use crate::backends::{Screen, ScreenInput, Screenshot};
use crate::edge::Edge;
use crate::error::EdgeError;
use crate::model::{BackendKind, Caller};

impl Edge {
    /// The screen of `id`'s backend, once the sandbox runs; `action` is
    /// checked first.
    async fn screen_of(&self, caller: &Caller, id: &str, action: Option<&ScreenInput>) -> Result<&dyn Screen, EdgeError> {
        let entry = self.entry(caller, id)?;
        let kind = entry.record().spec.backend;
        let Some(screen) = self.inner.backends.get(kind)?.screen() else {
            return Err(EdgeError::NoScreen(format!(
                "sandbox {id} runs as a {} and has no screen; screenshots and input need backend \"vm\"",
                match kind {
                    BackendKind::Container => "container",
                    BackendKind::Microvm => "microVM",
                    BackendKind::Vm => "VM",
                    BackendKind::Fncall => "FnCall runner",
                }
            )));
        };
        if let Some(action) = action {
            screen.check_input(action)?;
        }
        self.running(caller, id).await?;
        Ok(screen)
    }

    /// The sandbox's screen as PNG.
    pub async fn screenshot(&self, caller: &Caller, id: &str) -> Result<Screenshot, EdgeError> {
        let screen = self.screen_of(caller, id, None).await?;
        let _activity = self.entry(caller, id)?.begin();
        screen.screenshot(id).await
    }

    /// Sends keyboard or mouse input to the sandbox's screen.
    pub async fn screen_input(&self, caller: &Caller, id: &str, action: ScreenInput) -> Result<(), EdgeError> {
        let screen = self.screen_of(caller, id, Some(&action)).await?;
        let _activity = self.entry(caller, id)?.begin();
        screen.input(id, action).await
    }
}
