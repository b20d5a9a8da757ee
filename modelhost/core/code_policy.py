"""Whether a model may run code it brings (`--user-code`): the Python backend's model.py, and SageMaker's
`code/` (inference.py, requirements.txt, which pip installs).

- "all": code runs wherever the model came from, files a load request uploads included (Triton's behaviour).
- "repository" (the default): code runs when the model comes from the operator's own locations
  (--model-repository, a multi-model endpoint's archives, SageMaker's /opt/ml/model and the /models
  roots); a model made of files a client uploads with a load request (`file:` parameters) runs none.
- "none": no model runs code; a model that would fails its own load, the others load.

Model formats that are programs without being Python (TorchScript, SavedModel) are not user code here;
docs/model_management.md says what they can do.
"""

from __future__ import annotations

from dataclasses import dataclass

from modelhost.errors import invalid

USER_CODE_MODES = ("all", "repository", "none")  # --user-code


@dataclass(frozen=True, slots=True)
class CodePolicy:
    mode: str = "repository"

    def check(self, model: str, code: str, uploaded: bool = False) -> None:
        """Raise INVALID_INPUT naming the flag when `model`'s `code` (e.g. "model.py (Python backend)") may
        not run; `uploaded`: the model's files came with a load request rather than from a repository."""
        if self.mode == "all" or (self.mode == "repository" and not uploaded):
            return
        if self.mode == "repository":
            raise invalid(f"model '{model}' would run {code} from files a load request uploaded, and this server "
                          "runs code only from its own model repository (--user-code repository; "
                          "--user-code all allows it)")
        raise invalid(f"model '{model}' would run {code}, and this server runs no model code (--user-code none)")
