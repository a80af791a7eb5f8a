"""spec: parses and validates what users write (SkyPilot task and job-group YAML) into frozen
models; every error names its document, field and line, and nothing is stored on error."""

from corral.spec.loader import LoadedJob, SpecError, SpecIssue, load_job
from corral.spec.models import JobSpec, Resources, TaskSpec

__all__ = ["JobSpec", "LoadedJob", "Resources", "SpecError", "SpecIssue", "TaskSpec", "load_job"]
