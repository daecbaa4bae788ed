//! The `process.Process` service: commands and terminals started for the
//! client, their output streamed back, their input, signals and sizes.
//!
//! - [`stream`]: `Start` and `Connect`, and a started process's life;
//! - [`spawn`]: how a child is started (environment, directory, user, stdio);
//! - [`output`]: the fan-out of a process's output to its streams;
//! - [`table`]: the running processes, by pid and tag;
//! - [`pty`]: the terminals;
//! - [`exit`]: how an end is told (as E2B's envd tells it).

pub mod exit;
pub mod output;
pub mod pty;
pub mod spawn;
pub mod stream;
pub mod table;

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Request, Response};
use stream::StreamOptions;
use table::Input;
pub use table::Processes;

use crate::connect::{self, Body, ClientStream, RpcError, RpcResult};
use crate::proto::process::stream_input_request::Event as InputEvent;
use crate::proto::process::{
    process_input, CloseStdinRequest, CloseStdinResponse, ListRequest, ListResponse, ProcessInput,
    SendInputRequest, SendInputResponse, SendSignalRequest, SendSignalResponse, Signal,
    StreamInputRequest, StreamInputResponse, UpdateRequest, UpdateResponse,
};
use crate::state::{Ctx, State};

/// The service's methods (the arms of [`route`]).
const METHODS: &[&str] = &[
    "Start",
    "Connect",
    "List",
    "Update",
    "SendInput",
    "StreamInput",
    "SendSignal",
    "CloseStdin",
];

/// Whether the service has `method`.
pub fn has_method(method: &str) -> bool {
    METHODS.contains(&method)
}

/// Serves `/process.Process/<method>`; `None` for a method it does not have.
pub async fn route(ctx: Ctx, method: &str, req: Request<Incoming>) -> Option<Response<Body>> {
    let state = ctx.state.clone();
    let response = match method {
        "Start" => {
            let options = StreamOptions::of(req.headers());
            connect::server_streaming(req, move |msg, s| stream::start(ctx, msg, s, options)).await
        }
        "Connect" => {
            let options = StreamOptions::of(req.headers());
            connect::server_streaming(req, move |msg, s| stream::connect(state, msg, s, options))
                .await
        }
        "List" => {
            connect::unary(req, |_: ListRequest| async move {
                Ok(ListResponse {
                    processes: state.processes.list(),
                })
            })
            .await
        }
        "Update" => connect::unary(req, |msg| update(&state, msg)).await,
        "SendInput" => connect::unary(req, |msg| send_input(&state, msg)).await,
        "StreamInput" => connect::client_streaming(req, |s| stream_input(&state, s)).await,
        "SendSignal" => connect::unary(req, |msg| send_signal(&state, msg)).await,
        "CloseStdin" => connect::unary(req, |msg| close_stdin(&state, msg)).await,
        _ => return None,
    };
    Some(response)
}

async fn update(state: &Arc<State>, req: UpdateRequest) -> RpcResult<UpdateResponse> {
    let proc = state.processes.find(req.process.as_ref())?;
    if let Some(pty) = req.pty {
        let size = pty
            .size
            .ok_or_else(|| RpcError::invalid_argument("a pty update needs a size"))?;
        let dimension = |value: u32, what: &str| {
            u16::try_from(value).map_err(|_| {
                RpcError::invalid_argument(format!("a terminal's {what} must be below 65536"))
            })
        };
        proc.resize(dimension(size.rows, "rows")?, dimension(size.cols, "cols")?)?;
    }
    Ok(UpdateResponse {})
}

fn input_of(input: Option<ProcessInput>) -> RpcResult<Input> {
    match input.and_then(|i| i.input) {
        Some(process_input::Input::Stdin(data)) => Ok(Input::Stdin(data)),
        Some(process_input::Input::Pty(data)) => Ok(Input::Pty(data)),
        None => Err(RpcError::invalid_argument("input must be stdin or pty")),
    }
}

async fn send_input(state: &Arc<State>, req: SendInputRequest) -> RpcResult<SendInputResponse> {
    let proc = state.processes.find(req.process.as_ref())?;
    proc.write(input_of(req.input)?).await?;
    Ok(SendInputResponse {})
}

/// `StreamInput`: a `start` naming the process, then its input, in order.
async fn stream_input(
    state: &Arc<State>,
    mut messages: ClientStream<StreamInputRequest>,
) -> RpcResult<StreamInputResponse> {
    let mut proc = None;
    while let Some(message) = messages.next().await {
        match message?.event {
            Some(InputEvent::Start(start)) => {
                proc = Some(state.processes.find(start.process.as_ref())?)
            }
            Some(InputEvent::Data(data)) => {
                let proc = proc
                    .as_ref()
                    .ok_or_else(|| RpcError::invalid_argument("input before the start event"))?;
                proc.write(input_of(data.input)?).await?;
            }
            Some(InputEvent::Keepalive(_)) => {}
            None => return Err(RpcError::invalid_argument("a message with no event")),
        }
    }
    Ok(StreamInputResponse {})
}

async fn send_signal(state: &Arc<State>, req: SendSignalRequest) -> RpcResult<SendSignalResponse> {
    let proc = state.processes.find(req.process.as_ref())?;
    let signal = match Signal::try_from(req.signal) {
        Ok(Signal::Sigkill) => libc::SIGKILL,
        Ok(Signal::Sigterm) => libc::SIGTERM,
        Ok(Signal::Unspecified) | Err(_) => {
            return Err(RpcError::invalid_argument(format!(
                "invalid signal {}",
                req.signal
            )))
        }
    };
    proc.signal(signal)?;
    Ok(SendSignalResponse {})
}

async fn close_stdin(state: &Arc<State>, req: CloseStdinRequest) -> RpcResult<CloseStdinResponse> {
    let proc = state.processes.find(req.process.as_ref())?;
    proc.close_stdin().await?;
    Ok(CloseStdinResponse {})
}
