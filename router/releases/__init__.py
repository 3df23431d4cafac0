"""Collector releases and upgrades: publishing, listing and yanking releases with their SBOMs, the
TUF update repository (one host or shared through PostgreSQL), the update policy that picks each
collector's target, and the supervisor's reports."""
