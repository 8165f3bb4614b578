//! Streaming transfers: an upload's body is sent as it is produced and a
//! download is handed over as it arrives, so a file or a tree of any size
//! crosses in constant memory (the CLI's `dsec cp`).

use bytes::Bytes;
use http::{header, Method, Request, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};

use crate::{api_error, Client, ClientError};

/// The pieces of an upload's body, in order; an error ends the upload (the
/// server then sees a cut body and keeps nothing).
pub type Chunks = tokio::sync::mpsc::Receiver<std::io::Result<Bytes>>;

pub(crate) type StreamedBody = UnsyncBoxBody<Bytes, std::io::Error>;

fn streamed(chunks: Chunks) -> StreamedBody {
    let frames = futures_util::stream::unfold(chunks, |mut rx| async move {
        let next = rx.recv().await?;
        Some((next.map(Frame::data), rx))
    });
    StreamBody::new(frames).boxed_unsync()
}

impl Client {
    /// `PUT path_and_query` with a body read from `chunks`. With `len`, the
    /// request says its length (a server refuses one over its limit before
    /// any byte is sent, and hyper checks the body matches); without, the
    /// body is chunked. Answers with the response body.
    pub async fn put_stream(
        &self,
        path_and_query: &str,
        content_type: &str,
        len: Option<u64>,
        chunks: Chunks,
    ) -> Result<Bytes, ClientError> {
        let resp = self.send_stream(Method::PUT, path_and_query, content_type, len, chunks).await?;
        let status = resp.status();
        let body = self.read_body(resp.into_body()).await?;
        if !status.is_success() {
            return Err(api_error(status, &body));
        }
        Ok(body)
    }

    /// A request whose body is read from `chunks`, to the current endpoint.
    async fn send_stream(
        &self,
        method: Method,
        path_and_query: &str,
        content_type: &str,
        len: Option<u64>,
        chunks: Chunks,
    ) -> Result<http::Response<Incoming>, ClientError> {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{}{path_and_query}", self.endpoint()))
            .header(header::CONTENT_TYPE, content_type);
        if let Some(a) = &self.auth {
            req = req.header(header::AUTHORIZATION, a);
        }
        if let Some(n) = len {
            req = req.header(header::CONTENT_LENGTH, n);
        }
        let req = req.body(streamed(chunks)).map_err(|e| ClientError::Endpoint(e.to_string()))?;
        self.streaming.request(req).await.map_err(|e| self.connect_error(e))
    }

    /// `GET path_and_query`, answering with the response body unread, for
    /// the caller to take frame by frame. An error status is read whole and
    /// returned as the error.
    pub async fn get_stream(&self, path_and_query: &str) -> Result<Incoming, ClientError> {
        let mut req = Request::builder().method(Method::GET).uri(format!("{}{path_and_query}", self.endpoint()));
        if let Some(a) = &self.auth {
            req = req.header(header::AUTHORIZATION, a);
        }
        let req = req.body(Full::new(Bytes::new())).map_err(|e| ClientError::Endpoint(e.to_string()))?;
        let resp = self.http.request(req).await.map_err(|e| self.connect_error(e))?;
        self.unread_ok(resp).await
    }

    /// `POST path_and_query` with a body read from `chunks` (chunked),
    /// answering with the response body unread, for the caller to take as
    /// it arrives (a build's progress). An error status is read whole and
    /// returned as the error.
    pub async fn post_stream(&self, path_and_query: &str, content_type: &str, chunks: Chunks) -> Result<Incoming, ClientError> {
        let resp = self.send_stream(Method::POST, path_and_query, content_type, None, chunks).await?;
        self.unread_ok(resp).await
    }

    /// The body of a `200 OK`, unread; any other answer read whole as the
    /// error.
    async fn unread_ok(&self, resp: http::Response<Incoming>) -> Result<Incoming, ClientError> {
        let status = resp.status();
        if status != StatusCode::OK {
            let body = self.read_body(resp.into_body()).await?;
            return Err(api_error(status, &body));
        }
        Ok(resp.into_body())
    }
}
