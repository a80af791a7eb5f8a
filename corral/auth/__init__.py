"""Who is calling the API and what they may do.

``roles`` names the four roles and turns every refusal into a sentence naming the role it
needs; ``tokens`` issues, verifies and revokes bearer tokens (kept only as digests) and
recognises the server owner's local token; ``audit`` records who changed what; ``accounts``
maps each user to the Unix account their jobs run as, and hands that account its files. The client's
side (the local token file, saved logins) is ``corral.credentials``: the CLI imports it on
every command, so it stays free of the server's libraries."""
