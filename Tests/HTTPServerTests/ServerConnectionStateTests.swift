// The connection's lifecycle as a value: every transition and the action it returns, without a
// socket (the connection suites drive the same transitions over loopback).
@testable import HTTPServer
import Testing

@Suite struct ServerConnectionStateTests {
    typealias State = ServerConnectionState

    @Test func proxyHeaderGatesInputThenTheProtocolServes() {
        var s = State(protocol: .http1, proxyHeader: true, shuttingDown: false)
        #expect(s.awaitingProxyHeader)
        #expect(s.bytesRead(10) == .proxyHeader)
        s.proxyHeaderReceived()
        #expect(s.phase == .open(.http1))
        #expect(!s.awaitingProxyHeader)
        #expect(s.bytesRead(10) == .payload)
        #expect(s.isHTTP1)
    }

    @Test func protocolChoiceKeepsTheDrainAndItsAbruptness() {
        var s = State(protocol: .sniffing, proxyHeader: false, shuttingDown: false)
        s.protocolChosen(.http2)
        #expect(s.phase == .open(.http2))
        s.closeAfterFlush(abrupt: true)
        s.protocolChosen(.http1)
        #expect(s.phase == .draining(.http1, abrupt: true))
        var p = State(protocol: .sniffing, proxyHeader: true, shuttingDown: false)
        p.protocolChosen(.http1)
        #expect(p.phase == .awaitingProxyHeader(next: .http1))
    }

    @Test func anAbruptCloseStaysAbrupt() {
        var s = State(protocol: .http1, proxyHeader: false, shuttingDown: false)
        #expect(s.outputDrained() == .none)
        s.closeAfterFlush(abrupt: true)
        s.closeAfterFlush()
        #expect(s.phase == .draining(.http1, abrupt: true))
        #expect(s.outputDrained() == .close)
    }

    @Test func aGracefulCloseLingersUntilTheByteCap() {
        var s = State(protocol: .http1, proxyHeader: false, shuttingDown: false)
        s.closeAfterFlush()
        #expect(s.closesAfterFlush)
        #expect(s.outputDrained() == .closeGracefully)
        s.lingerStarted()
        #expect(s.isClosed)
        #expect(s.connectionProtocol == nil)
        #expect(s.bytesRead(State.lingerMaxBytes) == .discard)
        #expect(s.bytesRead(1) == .close)
        #expect(s.closeRequested() == true)
        #expect(s.phase == .closed)
        #expect(s.closeRequested() == false)
        #expect(s.bytesRead(1) == .ignore)
    }

    @Test func lingeringEndsAtEOFOrTheTimer() {
        var s = State(protocol: .http2, proxyHeader: false, shuttingDown: false)
        s.closeAfterFlush()
        s.lingerStarted()
        #expect(s.eofRead(requestsPending: true) == .close)
        #expect(s.timerFired() == .close)
        #expect(s.closeRequested() == true)
        #expect(s.timerFired() == .ignore)
        #expect(s.eofRead(requestsPending: true) == .ignore)
    }

    @Test func lingeringStartsOnlyFromADrain() {
        var s = State(protocol: .http1, proxyHeader: false, shuttingDown: false)
        s.lingerStarted()
        #expect(s.phase == .open(.http1))
        #expect(s.closeRequested() == true)
        s.closeAfterFlush()
        s.lingerStarted()
        #expect(s.phase == .closed)
    }

    @Test func halfCloseAnswersPendingHTTP1RequestsThenClosesAbruptly() {
        var s = State(protocol: .http1, proxyHeader: false, shuttingDown: false)
        #expect(s.eofRead(requestsPending: true) == .answerPending)
        #expect(s.peerHalfClosed)
        #expect(s.stopsParsing)
        #expect(!s.gate.reads)
        #expect(s.stopParsing() == false)   // already stopped: reading stopped with the EOF
        s.closeAfterFlush()
        #expect(s.outputDrained() == .close)   // no FIN and linger for a peer that sent EOF
    }

    @Test func eofWithoutPendingRequestsCloses() {
        var h1 = State(protocol: .http1, proxyHeader: false, shuttingDown: false)
        #expect(h1.eofRead(requestsPending: false) == .close)
        var h2 = State(protocol: .http2, proxyHeader: false, shuttingDown: false)
        #expect(h2.eofRead(requestsPending: true) == .close)
        #expect(!h2.peerHalfClosed)
    }

    @Test func stopParsingAsksToStopReadingOnce() {
        var s = State(protocol: .http1, proxyHeader: false, shuttingDown: false)
        #expect(s.gate.reads)
        #expect(s.stopParsing() == true)
        #expect(s.stopParsing() == false)
        #expect(s.gate.input == .stopped)
        #expect(!s.gate.reads)
    }

    @Test func pausesAreIndependentOfEachOther() {
        var s = State(protocol: .http1, proxyHeader: false, shuttingDown: false)
        #expect(s.pipelineHasRoom() == .none)   // not paused
        s.pauseForWrites()
        s.pauseForPipeline()
        #expect(!s.gate.reads)
        #expect(s.pipelineHasRoom() == .parse)   // the output still holds reading back
        #expect(!s.gate.reads)
        s.pauseForPipeline()
        s.writesDrained()
        #expect(!s.gate.reads)
        #expect(s.pipelineHasRoom() == .readAndParse)
        #expect(s.gate.reads)
    }

    @Test func aStoppedConnectionDoesNotResumeForThePipeline() {
        var s = State(protocol: .http1, proxyHeader: false, shuttingDown: false)
        s.pauseForPipeline()
        _ = s.stopParsing()
        #expect(s.pipelineHasRoom() == .none)
        #expect(!s.gate.reads)
    }

    @Test func shutdownPerProtocol() {
        var h2 = State(protocol: .http2, proxyHeader: false, shuttingDown: false)
        #expect(h2.shutdownBegun(requestsPending: false) == .goAway)
        #expect(h2.shuttingDown)
        #expect(h2.phase == .open(.http2))

        var sniffing = State(protocol: .sniffing, proxyHeader: false, shuttingDown: false)
        #expect(sniffing.shutdownBegun(requestsPending: false) == .close)

        var busy = State(protocol: .http1, proxyHeader: false, shuttingDown: false)
        #expect(busy.shutdownBegun(requestsPending: true) == .stopReading(flush: false))
        #expect(busy.stopsParsing)
        #expect(busy.phase == .open(.http1))   // closes after the last pending answer

        var idle = State(protocol: .http1, proxyHeader: true, shuttingDown: false)
        #expect(idle.shutdownBegun(requestsPending: false) == .stopReading(flush: true))
        #expect(idle.phase == .draining(.http1, abrupt: false))

        var closed = State(protocol: .http1, proxyHeader: false, shuttingDown: false)
        _ = closed.closeRequested()
        #expect(closed.shutdownBegun(requestsPending: false) == .ignore)
        #expect(!closed.shuttingDown)
    }

    @Test func shutdownKeepsAHalfClose() {
        var s = State(protocol: .http1, proxyHeader: false, shuttingDown: true)
        #expect(s.shuttingDown)
        _ = s.eofRead(requestsPending: true)
        _ = s.shutdownBegun(requestsPending: true)
        #expect(s.peerHalfClosed)
    }

    @Test func closingFromEveryLivePhase() {
        for start in [State.Phase.awaitingProxyHeader(next: .http1), .open(.sniffing),
                      .draining(.http2, abrupt: false), .lingering(discarded: 3)] {
            var s = State(protocol: .http1, proxyHeader: false, shuttingDown: false)
            switch start {
            case .awaitingProxyHeader: s = State(protocol: .http1, proxyHeader: true, shuttingDown: false)
            case .open(let p): s.protocolChosen(p)
            case .draining(let p, _): s.protocolChosen(p); s.closeAfterFlush()
            case .lingering: s.closeAfterFlush(); s.lingerStarted()
            case .closed: break
            }
            #expect(s.closeRequested() == true, "\(start)")
            #expect(s.isClosed)
            #expect(s.timerFired() == .ignore)
            s.closeAfterFlush()
            #expect(s.phase == .closed)
        }
    }
}
