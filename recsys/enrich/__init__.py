"""LLM-written item metadata: a versioned prompt and record (`record`), guided decoding of a local model (`guided`,
`local`), an OpenAI-compatible HTTP backend (`http`), a resumable cache (`cache`) and the catalogue run (`run`).
docs/enrich.md says how to run it and which consumers to turn on."""
