"""The KV side of a service: a tiered, content-addressed store of the global (compressed) cache pages
(host memory, then block files on local SSD), cache export and import between engines, and the
PROMPT / COMPLETION engines of prefill/decode disaggregation."""
