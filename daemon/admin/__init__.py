"""The admin side: the admin listener's routes (`routes`) and the answers its OpenAPI
document publishes (`schema`), the call the commands make to a running daemon
(`client`), and putting final dlqIds back into the pipeline (`redrive`). It may use the
stages, the store and the client; no stage uses it, but for the commands' `client`, which
knows only the settings (pyproject.toml's layers place it below the stages).
"""
