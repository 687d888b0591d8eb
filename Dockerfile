# legion in a container: one run per container (docs/servers.md, "Containers and Kubernetes").
#   docker build -t legion .
#   docker run --rm -v "$PWD:/work/project" -e ANTHROPIC_API_KEY legion -C /work/project run "the task"
# The package is installed from this checkout (it is not on the package index).
FROM python:3.11-slim-bookworm

# git: worktrees and team branches; procps: `ps` for an operator's shell in the pod
RUN apt-get update \
 && apt-get install -y --no-install-recommends git procps \
 && rm -rf /var/lib/apt/lists/*

COPY . /src/legion
RUN pip install --no-cache-dir /src/legion && rm -rf /src/legion

# An unprivileged user with a home of its own (git reads ~/.gitconfig; pi reads ~/.pi) and a git identity for the
# commits of team members. A project mounted from the host or a volume is usually owned by another uid: git
# refuses such a checkout ("dubious ownership") unless it is a safe.directory.
RUN useradd --create-home --uid 1000 --shell /bin/bash legion \
 && git config --system user.name "legion" \
 && git config --system user.email "legion@localhost" \
 && git config --system --add safe.directory '*'
USER legion
ENV HOME=/home/legion NO_COLOR=1 PYTHONUNBUFFERED=1
WORKDIR /work/project

ENTRYPOINT ["legion"]
CMD ["--help"]
