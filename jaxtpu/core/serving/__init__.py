"""What `jaxtpu serve` answers, free of any framework: Perspective API's request and response
(`perspective`), a run's label columns as Perspective's attribute names (`attributes`), the
sentences of a comment for span scores (`spans`), the discovery document that Google's API
client reads (`discovery`) and the model's version and card (`card`)."""
