//! Framing: a little-endian `u32` length, then that many bytes of postcard.
//!
//! Blocking helpers serve the agent's setup path and tests; the async
//! helpers (feature `async`) serve both long-lived ends of the channel.

use serde::{de::DeserializeOwned, Serialize};
use std::io::{Read, Write};

use crate::MAX_FRAME_BYTES;

#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("channel i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("frame of {0} bytes exceeds the limit of {MAX_FRAME_BYTES}")]
    FrameTooLarge(usize),
    #[error("undecodable frame: {0}")]
    Decode(postcard::Error),
    #[error("unencodable message: {0}")]
    Encode(postcard::Error),
    #[error("the peer closed the channel")]
    Closed,
}

/// Encode one message as a complete frame (length prefix included).
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, CodecError> {
    // Reserve the length prefix, then let postcard append after it.
    let out = postcard::to_extend(msg, vec![0u8; 4]).map_err(CodecError::Encode)?;
    let body = out.len() - 4;
    if body > MAX_FRAME_BYTES {
        return Err(CodecError::FrameTooLarge(body));
    }
    let mut out = out;
    out[..4].copy_from_slice(&(body as u32).to_le_bytes());
    Ok(out)
}

/// Decode a frame body (without its length prefix).
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, CodecError> {
    postcard::from_bytes(body).map_err(CodecError::Decode)
}

fn check_len(header: [u8; 4]) -> Result<usize, CodecError> {
    let len = u32::from_le_bytes(header) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(CodecError::FrameTooLarge(len));
    }
    Ok(len)
}

pub fn write_frame<W: Write, T: Serialize>(w: &mut W, msg: &T) -> Result<(), CodecError> {
    w.write_all(&encode(msg)?)?;
    w.flush()?;
    Ok(())
}

pub fn read_frame<R: Read, T: DeserializeOwned>(r: &mut R) -> Result<T, CodecError> {
    let mut header = [0u8; 4];
    if let Err(e) = r.read_exact(&mut header) {
        return Err(if e.kind() == std::io::ErrorKind::UnexpectedEof { CodecError::Closed } else { e.into() });
    }
    let mut body = vec![0u8; check_len(header)?];
    r.read_exact(&mut body)?;
    decode(&body)
}

#[cfg(feature = "async")]
mod asynchronous {
    use super::*;
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

    pub async fn write_frame_async<W, T>(w: &mut W, msg: &T) -> Result<(), CodecError>
    where
        W: AsyncWrite + Unpin,
        T: Serialize,
    {
        w.write_all(&encode(msg)?).await?;
        Ok(())
    }

    /// Reads one frame; `Ok(None)` on a clean end of stream between frames.
    pub async fn read_frame_async<R, T>(r: &mut R) -> Result<Option<T>, CodecError>
    where
        R: AsyncRead + Unpin,
        T: DeserializeOwned,
    {
        let mut header = [0u8; 4];
        match r.read_exact(&mut header).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        let mut body = vec![0u8; check_len(header)?];
        r.read_exact(&mut body).await?;
        decode(&body).map(Some)
    }
}

#[cfg(feature = "async")]
pub use asynchronous::*;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::*;

    #[test]
    fn round_trip_every_direction() {
        let msgs = vec![
            ToAgent::Hello(EdgeHello::ours(PROTOCOL_VERSION)),
            ToAgent::Request {
                id: 7,
                op: Op::Exec(ExecSpec {
                    command: Command::Shell("echo hi".into()),
                    env: vec![("A".into(), "b".into())],
                    cwd: Some("/tmp".into()),
                    user: None,
                    stdin: Stdin::Bytes(vec![0, 1, 255]),
                    stream_output: false,
                    timeout_ms: Some(1000),
                    kill_grace_ms: 500,
                    max_output_bytes: 1 << 20,
                    session: None,
                }),
            },
            ToAgent::Data { id: 7, data: vec![9; 100_000] },
            ToAgent::Credit { id: 7, bytes: 12 },
        ];
        for m in msgs {
            let frame = encode(&m).unwrap();
            let got: ToAgent = read_frame(&mut &frame[..]).unwrap();
            assert_eq!(got, m);
        }
        let reply = FromAgent::Reply { id: 3, result: Err(AgentError::new(ErrorKind::NotFound, "no such file")) };
        let frame = encode(&reply).unwrap();
        let got: FromAgent = read_frame(&mut &frame[..]).unwrap();
        assert_eq!(got, reply);
    }

    #[test]
    fn oversized_length_is_refused_before_allocating() {
        let bytes = u32::MAX.to_le_bytes();
        let err = read_frame::<_, ToAgent>(&mut &bytes[..]).unwrap_err();
        assert!(matches!(err, CodecError::FrameTooLarge(_)));
    }

    #[test]
    fn garbage_is_a_decode_error_not_a_panic() {
        let mut frame = 5u32.to_le_bytes().to_vec();
        frame.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff]);
        let err = read_frame::<_, ToAgent>(&mut &frame[..]).unwrap_err();
        assert!(matches!(err, CodecError::Decode(_)));
    }

    #[test]
    fn end_of_stream_is_closed() {
        let err = read_frame::<_, ToAgent>(&mut &[][..]).unwrap_err();
        assert!(matches!(err, CodecError::Closed));
    }
}
