//! Embedding a2ad in your own binary, two ways:
//!
//! 1. the whole HTTP server, on a port of your choosing, with your own agent backend;
//! 2. only the actor system: submit a message, follow a task, cancel one and read the
//!    card, with no HTTP at all.
//!
//! Run it with `cargo run --example embed`.

use std::sync::Arc;
use std::time::Duration;

use a2ad::config::{AgentConfig, ApiKeyConfig, StoreConfig};
use a2ad::{
    Agent, AgentError, AgentFuture, AgentId, AgentRequest, Config, Message, Principal, Runtime,
    SendRequest, Server, Updates,
};

/// A backend of our own: shouts the user's text back, with one progress update.
struct Shout;

impl Agent for Shout {
    fn kind(&self) -> &str {
        "shout"
    }

    fn run(&self, request: AgentRequest, updates: Updates) -> AgentFuture {
        Box::pin(async move {
            updates.progress(Message::agent_text(["thinking loudly"]));
            let text = request.message.joined_text();
            if text.is_empty() {
                return Err(AgentError::new("nothing to shout"));
            }
            Ok(Message::agent_text([text.to_uppercase()]))
        })
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = Config::default();
    config.server.listen = "127.0.0.1:0".into();
    // Keep nothing on disk here (both halves below run on the same configuration). A
    // durable server keeps the default, `StoreConfig::default()`: ./a2ad-data/a2ad.redb.
    config.store = StoreConfig::memory();
    config.api_keys = vec![ApiKeyConfig::new("me", "embedded-key-0001")];
    config.agents = vec![AgentConfig::new("echo"), AgentConfig::new("shout")];
    let config = config.validated()?;

    // 1. The whole server, on a listener we bound, until we say stop.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let server = Server::builder(config.clone())
        .agent("shout", Shout)
        .listener(listener)
        .build()
        .await?;
    println!("serving on http://{}", server.local_addr()?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));
    let _ = stop.send(()); // a signal, a test's end, a parent's shutdown…
    serving.await??;

    // 2. The actor system alone.
    let runtime = Runtime::builder(Arc::new(config))
        .agent("shout", Shout)
        .start()
        .await?;
    let me = Principal::new("me");
    let shout = AgentId::new("shout");
    let request = |text: &str| SendRequest::new(Message::user_text([text]));

    let task = runtime
        .send(&me, &shout, request("hello"), Some(Duration::from_secs(5)))
        .await?;
    println!(
        "{} -> {:?}",
        task.id,
        task.status.message.as_ref().map(|m| m.joined_text())
    );

    let mut stream = runtime.stream(&me, &shout, request("streamed")).await?;
    while let Some(event) = stream.next().await {
        println!("event {} {}", event.seq, event.status.state);
    }

    let echo = AgentId::new("echo");
    let pending = runtime
        .send(&me, &echo, request("never mind"), None)
        .await?;
    match runtime
        .cancel(&me, &echo, &pending.id, Some("demo".into()))
        .await
    {
        Ok(t) => println!("canceled: {}", t.status.state),
        Err(e) => println!("already done: {e}"),
    }

    if let Some(card) = runtime.card(&shout) {
        println!(
            "{} ({}): {} requests",
            card.config.id, card.kind, card.metrics.total_requests
        );
    }
    runtime.shutdown(Duration::from_secs(5)).await;
    Ok(())
}
