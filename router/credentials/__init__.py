"""Device credentials the router handles: vault mode B's encrypted store and its relay to one
collector per dispatch, vault mode C's AppRole secret ids, and revoking a credential from running
tasks (protocol 5), with the CredentialService adapter."""
