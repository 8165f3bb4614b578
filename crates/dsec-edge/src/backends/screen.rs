//! What a sandbox with a screen (a full VM) is asked and answers: input
//! actions in screen coordinates and screenshots. The backend that has a
//! screen turns actions into its own input events (`fullvm::input`).

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

/// A screen image and its size.
#[derive(Debug, Clone, PartialEq)]
pub struct Screenshot {
    pub png: Vec<u8>,
    pub width: u32,
    pub height: u32,
}
