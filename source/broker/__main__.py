"""`python -m shadowtopic.broker`: run one source broker (shadowtopic.broker.server.main)."""
from shadowtopic.broker.server import main

main()
