//! The Connect protocol over HTTP/1.1, as envd speaks it with the SDK's
//! JSON codec: a unary call is a JSON body answered by a JSON body (an
//! error: the code's HTTP status and `{"code", "message"}`); a server
//! stream is one request envelope answered by envelopes (1 flag byte, a
//! 4-byte big-endian length, the message), the last one flagged end of
//! stream (0x02) with a JSON trailer holding the error, if any.

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use tokio::sync::mpsc;

use super::error::{Code, RpcError, RpcResult};

const FLAG_COMPRESSED: u8 = 0x01;
const FLAG_END_STREAM: u8 = 0x02;
const STREAM_JSON: &str = "application/connect+json";

/// Whether the request is a streaming call (`application/connect+...`).
pub fn is_stream(headers: &HeaderMap) -> bool {
    content_type(headers).starts_with("application/connect+")
}

fn content_type(headers: &HeaderMap) -> &str {
    headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("")
}

/// The request message of a unary call (a JSON body) or of a server stream
/// (one envelope holding JSON).
pub fn request<T: DeserializeOwned>(headers: &HeaderMap, body: &[u8]) -> RpcResult<T> {
    let ct = content_type(headers).split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    let json = match ct.as_str() {
        "application/json" => body,
        STREAM_JSON => unwrap_envelope(body)?,
        other => {
            return Err(RpcError::new(
                Code::Unimplemented,
                format!("content type {other:?} is not served: envd's routes here speak the Connect protocol with JSON"),
            ))
        }
    };
    // An empty unary body is the empty message.
    let json: &[u8] = if json.iter().all(u8::is_ascii_whitespace) { b"{}" } else { json };
    serde_json::from_slice(json).map_err(|e| RpcError::invalid(format!("invalid request message: {e}")))
}

fn unwrap_envelope(body: &[u8]) -> RpcResult<&[u8]> {
    let Some((head, rest)) = body.split_first_chunk::<5>() else {
        return Err(RpcError::invalid("a streaming request must hold one Connect envelope"));
    };
    if head[0] & FLAG_COMPRESSED != 0 {
        return Err(RpcError::new(Code::Unimplemented, "compressed request messages are not accepted"));
    }
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if rest.len() != len {
        return Err(RpcError::invalid(format!("the envelope announces {len} bytes but {} follow", rest.len())));
    }
    Ok(rest)
}

/// A unary call's answer.
pub fn unary<T: Serialize>(msg: &T) -> Response {
    match serde_json::to_vec(msg) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => RpcError::new(Code::Internal, format!("could not encode the answer: {e}")).into_response(),
    }
}

/// One frame of a server stream.
pub fn envelope(flags: u8, payload: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(payload.len() + 5);
    out.push(flags);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out.into()
}

/// The last frame of a server stream: its error, if any.
pub fn end_of_stream(err: Option<&RpcError>) -> Bytes {
    let trailer = match err {
        Some(e) => serde_json::json!({ "error": e.json() }),
        None => serde_json::json!({}),
    };
    envelope(FLAG_END_STREAM, trailer.to_string().as_bytes())
}

/// What a server stream's producer sends.
pub enum StreamItem {
    Message(serde_json::Value),
    /// The end (with its error, if any); nothing follows.
    End(Option<RpcError>),
}

/// A server stream fed from `rx`. If the producer goes away without an
/// `End`, the stream ends with `unavailable` (the sandbox went away while
/// the stream was open), never silently.
pub fn stream(rx: mpsc::Receiver<StreamItem>) -> Response {
    let frames = futures_util::stream::unfold(Some(rx), |rx| async move {
        let mut rx = rx?;
        let frame = match rx.recv().await {
            Some(StreamItem::Message(m)) => {
                return Some((Ok::<_, std::convert::Infallible>(envelope(0, m.to_string().as_bytes())), Some(rx)))
            }
            Some(StreamItem::End(err)) => end_of_stream(err.as_ref()),
            None => end_of_stream(Some(&RpcError::new(Code::Unavailable, "the sandbox ended before the stream completed"))),
        };
        Some((Ok(frame), None))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, STREAM_JSON)
        .body(Body::from_stream(frames))
        .unwrap_or_else(|_| RpcError::new(Code::Internal, "could not build the stream").into_response())
}

/// A stream that fails before its first message.
pub fn failed_stream(err: RpcError) -> Response {
    ([(header::CONTENT_TYPE, STREAM_JSON)], end_of_stream(Some(&err))).into_response()
}

/// protobuf's JSON form of `bytes`: standard base64 (URL-safe accepted).
pub fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

pub fn de_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    let s = String::deserialize(d)?;
    let cfg = GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
    let standard = GeneralPurpose::new(&base64::alphabet::STANDARD, cfg);
    let url_safe = GeneralPurpose::new(&base64::alphabet::URL_SAFE, cfg);
    standard.decode(&s).or_else(|_| url_safe.decode(&s)).map_err(|e| serde::de::Error::custom(format!("bytes must be base64: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(ct: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, ct.parse().unwrap());
        h
    }

    #[test]
    fn requests_come_as_json_or_one_envelope() {
        #[derive(Deserialize, Debug, PartialEq)]
        struct M {
            path: String,
        }
        let unary: M = request(&headers("application/json"), br#"{"path":"/a"}"#).unwrap();
        assert_eq!(unary.path, "/a");
        let framed = envelope(0, br#"{"path":"/b"}"#);
        let streamed: M = request(&headers(STREAM_JSON), &framed).unwrap();
        assert_eq!(streamed.path, "/b");
        assert!(is_stream(&headers(STREAM_JSON)) && !is_stream(&headers("application/json")));
        let short = request::<M>(&headers(STREAM_JSON), &framed[..framed.len() - 1]).unwrap_err();
        assert_eq!(short.code, Code::InvalidArgument);
        let mut compressed = framed.to_vec();
        compressed[0] = FLAG_COMPRESSED;
        assert_eq!(request::<M>(&headers(STREAM_JSON), &compressed).unwrap_err().code, Code::Unimplemented);
        assert_eq!(request::<M>(&headers("application/proto"), b"").unwrap_err().code, Code::Unimplemented);
    }

    #[test]
    fn the_end_of_stream_carries_the_error() {
        let end = end_of_stream(Some(&RpcError::new(Code::NotFound, "gone")));
        assert_eq!(end[0], FLAG_END_STREAM);
        let len = u32::from_be_bytes([end[1], end[2], end[3], end[4]]) as usize;
        let trailer: serde_json::Value = serde_json::from_slice(&end[5..5 + len]).unwrap();
        assert_eq!(trailer["error"]["code"], "not_found");
        assert_eq!(&end_of_stream(None)[5..], b"{}");
    }

    #[test]
    fn bytes_take_protobuf_json_form() {
        #[derive(Deserialize)]
        struct B {
            #[serde(deserialize_with = "de_bytes")]
            b: Vec<u8>,
        }
        let v: B = serde_json::from_str(r#"{"b":"aGk="}"#).unwrap();
        assert_eq!(v.b, b"hi");
        let v: B = serde_json::from_str(r#"{"b":"aGk"}"#).unwrap();
        assert_eq!(v.b, b"hi", "padding is optional");
        assert_eq!(b64(b"hi"), "aGk=");
    }
}
