//! Input for a child: the bytes of `Stdin::Bytes`, or the edge's `Data`
//! frames (credited back as they are written), for a stdin pipe or a PTY
//! master.

use crate::request::ReqCtx;

pub struct Input {
    chunk: Vec<u8>,
    off: usize,
    /// The current chunk came from the edge and must be credited.
    chunk_credited: bool,
    /// More input comes from the edge (`Stdin::Stream`, PTY keystrokes).
    from_edge: bool,
}

impl Input {
    pub fn bytes(data: Vec<u8>) -> Input {
        Input { chunk: data, off: 0, chunk_credited: false, from_edge: false }
    }

    pub fn stream() -> Input {
        Input { chunk: Vec::new(), off: 0, chunk_credited: false, from_edge: true }
    }

    pub fn none() -> Input {
        Input { chunk: Vec::new(), off: 0, chunk_credited: false, from_edge: false }
    }

    /// Bytes ready to be written now (pulling the next chunk from the edge).
    pub fn pending(&mut self, ctx: &ReqCtx) -> Option<&[u8]> {
        if self.off >= self.chunk.len() && self.from_edge {
            if let Some(next) = ctx.take_input() {
                self.chunk = next;
                self.off = 0;
                self.chunk_credited = true;
            }
        }
        (self.off < self.chunk.len()).then(|| &self.chunk[self.off..])
    }

    pub fn has_pending(&self, ctx: &ReqCtx) -> bool {
        self.off < self.chunk.len() || (self.from_edge && ctx.has_input())
    }

    /// `n` bytes of the pending data reached the child.
    pub fn wrote(&mut self, ctx: &ReqCtx, n: usize) {
        self.off += n;
        if self.off >= self.chunk.len() {
            self.finish_chunk(ctx);
        }
    }

    fn finish_chunk(&mut self, ctx: &ReqCtx) {
        if self.chunk_credited {
            ctx.consumed(self.chunk.len());
        }
        self.chunk = Vec::new();
        self.off = 0;
        self.chunk_credited = false;
    }

    /// The child stopped reading: drop what is pending (crediting the edge so
    /// it is never left waiting) and everything that arrives later.
    pub fn discard(&mut self, ctx: &ReqCtx) {
        self.finish_chunk(ctx);
        while let Some(c) = ctx.take_input() {
            ctx.consumed(c.len());
        }
    }

    /// Everything there will ever be has been written.
    pub fn finished(&self, ctx: &ReqCtx) -> bool {
        self.off >= self.chunk.len() && (!self.from_edge || ctx.input_done())
    }
}
