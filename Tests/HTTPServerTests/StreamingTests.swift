import Foundation
#if canImport(Glibc)
import Glibc
#endif
import EventLoops
import RawHTTP
import Testing
@testable import HTTPServer

extension HTTPServerTests {
// Deferred and streaming answers, body limits per route and the global body budget, over real
// loopback sockets against real servers. Nested in HTTPServerTests so that it runs serialized
// with the other timing-sensitive tests (one of these measures the process's CPU time).
@Suite
struct StreamingTests {

    // MARK: Deferred answers

    /// Each loop keeps its suspended requests in order to watch the long ones for hang-ups. Under
    /// steady load a recent suspension is always pending, so what was already looked at must be
    /// dropped as it goes, not only when the list empties: otherwise every request's context
    /// stays alive for as long as the load lasts.
    @Test func steadyDeferredLoadDoesNotKeepFinishedRequestsAlive() throws {
        var config = loopbackConfig()
        config.threads = 1
        let server = try startServer(config) { _, writer in
            onAnotherThread { writer.respond(HTTPResponse(status: 200, body: Array("ok".utf8))) }
            return .deferred
        }
        defer { server.stop() }
        // Two clients in turn, so that some request is always waiting on the loop.
        let connections = try (0..<2).map { _ in try RawConnection(port: server.port) }
        var answered = 0
        var mostAlive = 0
        for _ in 0..<1500 {
            for connection in connections { #expect(connection.sendAll("GET /d HTTP/1.1\r\nHost: a\r\n\r\n")) }
            for connection in connections where connection.readResponse()?.text == "ok" { answered += 1 }
            mostAlive = max(mostAlive, server.liveRequestContexts)
        }
        #expect(answered == 3000)
        // Kept: the last 20 ms of requests plus up to twice the compaction step (64), and the
        // answers other threads have not delivered yet (more on a busy machine); the leak kept
        // every one of them, so it stands at the request count. A count, not a time: a loaded
        // machine answers fewer requests in a given time, but holds no more of them.
        #expect(mostAlive < answered / 3, "\(mostAlive) request contexts alive after \(answered) requests")
        expectNoLeaks(server)
    }

    /// libmicrohttpd without a thread of its own has no wake-up channel: a resumed connection
    /// must wake its loop, or the answer waits for the loop's next time-out (up to a second).
    @Test(arguments: [false, true])
    func aDeferredAnswerGoesOutAtOnceFromAnyThread(fromTheLoop: Bool) throws {
        var config = loopbackConfig()
        config.threads = 2
        let server = try startServer(config) { _, writer in
            let answer: @Sendable () -> Void = { writer.respond(HTTPResponse(status: 200, body: Array("late".utf8))) }
            if fromTheLoop {
                // Later on the loop that took the request (as an upstream transfer answers).
                let loop = try! #require(EventLoop.current)
                onAnotherThread(after: 0.02) { loop.execute(answer) }
            } else {
                onAnotherThread(after: 0.02, answer)
            }
            return .deferred
        }
        defer { server.stop() }
        let connection = try RawConnection(port: server.port)
        var slowest = 0.0
        for _ in 0..<10 {
            let started = Date()
            #expect(connection.sendAll("GET /late HTTP/1.1\r\nHost: a\r\n\r\n"))
            #expect(connection.readResponse()?.text == "late")
            slowest = max(slowest, Date().timeIntervalSince(started))
        }
        #expect(slowest < 0.2, "an answer given 20 ms in arrived after \(slowest) s")
    }

    @Test func deferredResponseIsAnsweredFromAnotherThreadWithoutHoldingAWorker() throws {
        var config = loopbackConfig()
        config.threads = 1  // one worker: if a deferred request held it, /plain could not be served
        let server = try startServer(config) { request, writer in
            if request.path == "/plain" { return .response(HTTPResponse(status: 200, body: Array("plain".utf8))) }
            onAnotherThread(after: 0.3) {
                writer.respond(HTTPResponse(status: 202, headers: [(name: "x-late", value: "yes")],
                                            body: Array("answered later".utf8)))
            }
            return .deferred
        }
        defer { server.stop() }

        let deferred = try RawConnection(port: server.port)
        let started = Date()
        #expect(deferred.sendAll("GET /later HTTP/1.1\r\nHost: a\r\n\r\n"))
        // While the deferred request waits, the only worker serves another request at once.
        let plain = try RawConnection(port: server.port)
        #expect(plain.sendAll("GET /plain HTTP/1.1\r\nHost: a\r\n\r\n"))
        #expect(plain.readResponse()?.text == "plain")
        #expect(Date().timeIntervalSince(started) < 0.25, "plain request waited for the deferred one")

        let response = try #require(deferred.readResponse())
        #expect(response.status == 202)
        #expect(response.headers["x-late"] == "yes")
        #expect(response.text == "answered later")
        // Keep-alive still works after a deferred answer.
        #expect(deferred.sendAll("GET /plain HTTP/1.1\r\nHost: a\r\n\r\n"))
        #expect(deferred.readResponse()?.text == "plain")
        expectNoLeaks(server)
    }

    @Test func answeringInsideTheHandlerThroughTheWriterWorks() throws {
        let server = try startServer { request, writer in
            writer.respond(HTTPResponse(status: 201, body: Array("sync".utf8)))
            // The first answer wins: this one is ignored.
            return request.path == "/both" ? .response(HTTPResponse(status: 500)) : .deferred
        }
        defer { server.stop() }
        let connection = try RawConnection(port: server.port)
        for path in ["/deferred", "/both"] {
            #expect(connection.sendAll("GET \(path) HTTP/1.1\r\nHost: a\r\n\r\n"))
            let response = try #require(connection.readResponse())
            #expect(response.status == 201, "path \(path)")
            #expect(response.text == "sync")
        }
        expectNoLeaks(server)
    }

    // MARK: Streams

    @Test func streamedChunksArriveOneByOneBeforeTheNextIsWritten() throws {
        let firstChunkRead = DispatchSemaphore(value: 0)
        let producerWaited = Shared(false)
        let server = try startServer { request, writer in
            if request.path == "/next" { return .response(HTTPResponse(status: 204)) }
            onAnotherThread {
                writer.startStream(status: 200, headers: [(name: "content-type", value: "text/event-stream")])
                writer.write(Array("event: one\n\n".utf8))
                // The second chunk is only written once the client has read the first.
                producerWaited.set(firstChunkRead.wait(timeout: .now() + 3) == .success)
                Thread.sleep(forTimeInterval: 0.05)
                writer.write(Array("event: two\n\n".utf8))
                writer.finish()
            }
            return .deferred
        }
        defer { server.stop() }

        let connection = try RawConnection(port: server.port)
        #expect(connection.sendAll("POST /v1/messages HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}"))
        let head = try #require(connection.readHead())
        #expect(head.status == 200)
        #expect(head.headers["transfer-encoding"] == "chunked")
        #expect(head.headers["content-type"] == "text/event-stream")
        #expect(head.headers["content-length"] == nil)
        #expect(connection.readChunk().map { String(decoding: $0, as: UTF8.self) } == "event: one\n\n")
        firstChunkRead.signal()
        #expect(connection.readChunk().map { String(decoding: $0, as: UTF8.self) } == "event: two\n\n")
        #expect(connection.readChunk() == [])
        #expect(producerWaited.get, "the first chunk only arrived after the producer gave up waiting")
        // The connection is reusable after the terminating chunk.
        #expect(connection.sendAll("GET /next HTTP/1.1\r\nHost: a\r\n\r\n"))
        #expect(connection.readResponse()?.status == 204)
        expectNoLeaks(server)
    }

    @Test func manyOpenStreamsDoNotStarvePlainRequestsOnTwoWorkers() throws {
        var config = loopbackConfig()
        config.threads = 2
        config.maxConnectionsPerIP = 0
        let writers = Shared<[HTTPResponseWriter]>([])
        let server = try startServer(config) { request, writer in
            if request.path == "/plain" { return .response(HTTPResponse(status: 200, body: Array("ok".utf8))) }
            writer.startStream(status: 200, headers: [])
            writer.write(Array("hello".utf8))
            writers.update { $0.append(writer) }
            return .deferred
        }
        defer { server.stop() }

        // HTTPSERVER_STREAMS=1000 runs the same check at the relay's target scale.
        let streamCount = ProcessInfo.processInfo.environment["HTTPSERVER_STREAMS"].flatMap { Int($0) } ?? 150
        let rssBefore = residentBytes()
        let threadsBefore = threadCount()
        // The whole test process is measured (other suites' leftovers included), so idle streams
        // are compared with the same process a moment before they were opened.
        let baselineStart = processCPUSeconds()
        usleep(600_000)
        let baselineCPU = processCPUSeconds() - baselineStart
        let streams = try (0..<streamCount).map { _ in try RawConnection(port: server.port) }
        for stream in streams { #expect(stream.sendAll("GET /stream HTTP/1.1\r\nHost: a\r\n\r\n")) }
        var opened = 0
        for stream in streams where stream.readHead()?.status == 200 && stream.readChunk() == Array("hello".utf8) {
            opened += 1
        }
        #expect(opened == streamCount)
        #expect(writers.get.count == streamCount)
        let rssPerStream = Double(residentBytes() - rssBefore) / Double(streamCount)
        let addedThreads = threadCount() - threadsBefore

        // Waiting streams cost no CPU (a content reader that returned 0 without suspending would
        // keep both workers spinning: ~1.2 CPU-seconds in these 0.6 s).
        let cpuBefore = processCPUSeconds()
        usleep(600_000)
        let idleCPU = processCPUSeconds() - cpuBefore
        #expect(idleCPU - baselineCPU < 0.3, "\(idleCPU) CPU-seconds in 0.6 s with \(streamCount) idle streams (\(baselineCPU) without)")

        // All streams are open and idle; plain requests are answered promptly.
        var latencies: [Double] = []
        let plain = try RawConnection(port: server.port)
        for _ in 0..<100 {
            let started = Date()
            guard plain.sendAll("GET /plain HTTP/1.1\r\nHost: a\r\n\r\n"), plain.readResponse()?.text == "ok" else { break }
            latencies.append(Date().timeIntervalSince(started))
        }
        #expect(latencies.count == 100)
        latencies.sort()
        let p99 = latencies.isEmpty ? .infinity : latencies[min(latencies.count - 1, latencies.count * 99 / 100)]
        #expect(p99 < 0.1, "p99 \(p99 * 1000) ms with \(streamCount) open streams")
        print("streams: \(streamCount) open on 2 workers; plain requests p50 \(latencies.isEmpty ? 0 : latencies[latencies.count / 2] * 1000) ms, "
              + "p99 \(p99 * 1000) ms; idle CPU \(idleCPU) s per 0.3 s; RSS +\(Int(rssPerStream)) B per stream "
              + "(client and server in this process); threads added: \(addedThreads)")
        #expect(addedThreads <= 0, "open streams added \(addedThreads) threads")

        // Every stream still delivers its next chunk and its end.
        for writer in writers.get {
            writer.write(Array("bye".utf8))
            writer.finish()
        }
        var finished = 0
        for stream in streams where stream.readChunk() == Array("bye".utf8) && stream.readChunk() == [] { finished += 1 }
        #expect(finished == streamCount)
        writers.set([])
        expectNoLeaks(server)
    }

    @Test func clientDisconnectMidStreamFiresOnCancelPromptly() throws {
        let cancelledAt = Shared<Date?>(nil)
        let writeAfterCancel = Shared<Bool?>(nil)
        let taken = Shared<HTTPResponseWriter?>(nil)
        let server = try startServer { _, writer in
            taken.set(writer)
            writer.onCancel {
                cancelledAt.set(Date())
                writeAfterCancel.set(writer.write(Array("late".utf8)))
            }
            writer.startStream(status: 200, headers: [])
            writer.write(Array("first".utf8))
            return .deferred
        }
        defer { server.stop() }

        let connection = try RawConnection(port: server.port)
        #expect(connection.sendAll("GET /stream HTTP/1.1\r\nHost: a\r\n\r\n"))
        #expect(connection.readHead()?.status == 200)
        #expect(connection.readChunk() == Array("first".utf8))
        // Once the stream is suspended waiting for its producer, the client hangs up.
        #expect(waitUntil(timeout: 8) { taken.get?.state.withLock { $0.isSuspended } == true })
        taken.set(nil)   // the writer must be free to go (the leak check counts it)
        let closedAt = Date()
        connection.disconnect()
        #expect(waitUntil(timeout: 8) { cancelledAt.get != nil })
        if let cancelled = cancelledAt.get {
            // Suspended for 50 ms, so already in the hang-up watch (it joins after 20 ms), not
            // waiting for the reaper's next 250 ms tick.
            #expect(cancelled.timeIntervalSince(closedAt) < 0.2, "onCancel after \(cancelled.timeIntervalSince(closedAt)) s")
        }
        #expect(writeAfterCancel.get == false)
        expectNoLeaks(server)
    }

    @Test func clientDisconnectBeforeADeferredAnswerFiresOnCancel() throws {
        let cancelled = Shared(false)
        let taken = Shared<HTTPResponseWriter?>(nil)
        let server = try startServer { _, writer in
            taken.set(writer)
            writer.onCancel { cancelled.set(true) }
            return .deferred  // never answered
        }
        defer { server.stop() }

        let connection = try RawConnection(port: server.port)
        #expect(connection.sendAll("GET /never HTTP/1.1\r\nHost: a\r\n\r\n"))
        #expect(waitUntil(timeout: 8) { server.liveRequestContexts == 1 })
        // Suspended, waiting for the answer that never comes: now the client hangs up.
        #expect(waitUntil(timeout: 8) { taken.get?.state.withLock { $0.isSuspended } == true })
        taken.set(nil)   // the writer must be free to go (the leak check counts it)
        let closedAt = Date()
        connection.disconnect()
        #expect(waitUntil(timeout: 8) { cancelled.get })
        #expect(Date().timeIntervalSince(closedAt) < 0.2)
        expectNoLeaks(server)
    }

    /// An answer that comes after a bounded wait with nothing to cancel (the exchange's, waiting
    /// for its batch's commit) skips the hang-up watch: at 256 devices every exchange waited over
    /// its 20 ms, each paying two epoll_ctl calls and the monitor's lock for nothing. One loop
    /// looks at its suspensions in the order they began, so once the later request (watched) has
    /// joined, the earlier one (skipping) has been looked at too.
    @Test func aRequestThatSkipsTheHangUpWatchNeverJoinsIt() throws {
        var config = loopbackConfig()
        config.threads = 1
        let writers = Shared<[String: HTTPResponseWriter]>([:])
        let server = try startServer(config) { request, writer in
            if request.path == "/skip" { writer.skipHangUpWatch() }
            writers.update { $0[request.path] = writer }
            return .deferred
        }
        defer { server.stop() }
        let skipping = try RawConnection(port: server.port)
        #expect(skipping.sendAll("GET /skip HTTP/1.1\r\nHost: a\r\n\r\n"))
        #expect(waitUntil(timeout: 8) { writers.get["/skip"] != nil })
        let watched = try RawConnection(port: server.port)
        #expect(watched.sendAll("GET /watch HTTP/1.1\r\nHost: a\r\n\r\n"))
        #expect(waitUntil(timeout: 8) { writers.get["/watch"]?.isHangUpWatched == true })
        #expect(writers.get["/skip"]?.isHangUpWatched == false)
        #expect(server.hangUpWatchCount == 1)
        // Both still answer as usual.
        for (path, connection) in [("/skip", skipping), ("/watch", watched)] {
            writers.get[path]?.respond(HTTPResponse(status: 200, body: Array(path.utf8)))
            #expect(connection.readResponse()?.text == path)
        }
        #expect(waitUntil(timeout: 8) { server.hangUpWatchCount == 0 })
        writers.set([:])
        expectNoLeaks(server)
    }

    @Test func backPressureStopsThenResumesTheProducer() throws {
        var config = loopbackConfig()
        config.streamHighWaterBytes = 64 << 10
        config.streamLowWaterBytes = 16 << 10
        let writableFired = DispatchSemaphore(value: 0)
        let refusedAfter = Shared(-1)
        let totalWritten = Shared(0)
        let server = try startServer(config) { _, writer in
            writer.onWritable { writableFired.signal() }
            writer.startStream(status: 200, headers: [])
            onAnotherThread {
                let block = [UInt8](repeating: UInt8(ascii: "x"), count: 16 << 10)
                var written = 0
                // The client is not reading: sooner or later the socket and then our buffer fill.
                while written < 256 << 20 {
                    let accepted = writer.write(block)
                    written += block.count
                    if !accepted { break }
                }
                refusedAfter.set(written)
                // Resume once the client has drained the buffer below the low-water mark.
                if writableFired.wait(timeout: .now() + 5) == .success {
                    writer.write(Array("END".utf8))
                    written += 3
                }
                totalWritten.set(written)
                writer.finish()
            }
            return .deferred
        }
        defer { server.stop() }

        let connection = try RawConnection(port: server.port, timeout: 10, receiveBuffer: 16 << 10)
        #expect(connection.sendAll("GET /big HTTP/1.1\r\nHost: a\r\n\r\n"))
        #expect(waitUntil(timeout: 8) { refusedAfter.get > 0 })
        let refused = refusedAfter.get
        #expect(refused > 0 && refused < 256 << 20, "write never returned false (\(refused) bytes)")
        #expect(connection.readHead()?.status == 200)
        let body = try #require(connection.readChunkedBody())
        #expect(body.count == totalWritten.get)
        #expect(body.suffix(3) == Array("END".utf8))
        #expect(body.dropLast(3).allSatisfy { $0 == UInt8(ascii: "x") })
        expectNoLeaks(server)
    }

    @Test func invalidStreamStatusBecomes500AndCancelsTheProducer() throws {
        let cancelled = Shared(false)
        let server = try startServer { _, writer in
            writer.onCancel { cancelled.set(true) }
            writer.startStream(status: 200, headers: [(name: "x-bad", value: "a\r\nb")])
            return .deferred
        }
        defer { server.stop() }
        let connection = try RawConnection(port: server.port)
        #expect(connection.sendAll("GET / HTTP/1.1\r\nHost: a\r\n\r\n"))
        #expect(connection.readResponse()?.status == 500)
        #expect(cancelled.get)
        expectNoLeaks(server)
    }

    @Test func stopWithOpenStreamsDoesNotHangAndCancelsThem() throws {
        var config = loopbackConfig()
        config.maxConnectionsPerIP = 0
        let cancellations = Counter()
        let server = try startServer(config) { request, writer in
            writer.onCancel { _ = cancellations.next() }
            if request.path == "/deferred" { return .deferred }
            writer.startStream(status: 200, headers: [])
            if request.path == "/busy" {
                // Keeps the connection busy sending to a client that never reads.
                onAnotherThread {
                    let block = [UInt8](repeating: 0x61, count: 64 << 10)
                    for _ in 0..<1000 where writer.write(block) {}
                }
            } else {
                writer.write(Array("hi".utf8))
            }
            return .deferred
        }
        let connections = try (0..<10).map { index in
            let connection = try RawConnection(port: server.port, timeout: 3, receiveBuffer: 8 << 10)
            let path = index == 0 ? "/deferred" : index == 1 ? "/busy" : "/stream"
            _ = connection.sendAll("GET \(path) HTTP/1.1\r\nHost: a\r\n\r\n")
            return connection
        }
        #expect(waitUntil(timeout: 8) { server.liveRequestContexts == 10 })
        usleep(100_000)
        let started = Date()
        server.stop()
        let elapsed = Date().timeIntervalSince(started)
        #expect(elapsed < 2, "stop took \(elapsed) s")
        #expect(cancellations.current == 10)
        for connection in connections { _ = connection.waitForClose() }
        expectNoLeaks(server)
    }

    // MARK: Body limits

    @Test func bodyLimitIsChosenPerRoute() throws {
        var config = loopbackConfig()
        config.bodyLimit = { _, path in
            path == "/v1/messages" || path == "/v1/messages/count_tokens" ? 32_000_000 : 65_536
        }
        let server = try startServer(config) { request in
            HTTPResponse(status: 200, body: Array("\(request.body.count)".utf8))
        }
        defer { server.stop() }

        let big = try RawConnection(port: server.port, timeout: 10)
        let twentyMB = 20_000_000
        #expect(big.sendAll("POST /v1/messages HTTP/1.1\r\nHost: a\r\nContent-Length: \(twentyMB)\r\n\r\n"))
        #expect(big.sendAll([UInt8](repeating: 0x7b, count: twentyMB)))
        let accepted = try #require(big.readResponse())
        #expect(accepted.status == 200)
        #expect(accepted.text == "\(twentyMB)")

        // Refused from the declared length alone, before any body byte is sent.
        let small = try RawConnection(port: server.port)
        #expect(small.sendAll("POST /v1/oauth/token HTTP/1.1\r\nHost: a\r\nContent-Length: 65537\r\n\r\n"))
        let refused = try #require(small.readResponse())
        #expect(refused.status == 413)
        #expect(small.waitForClose() == .closed)

        // The query does not change the route; 32 MB + 1 is refused on the big route too.
        let over = try RawConnection(port: server.port)
        #expect(over.sendAll("POST /v1/messages/count_tokens?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 32000001\r\n\r\n"))
        #expect(over.readResponse()?.status == 413)

        // Chunked uploads are held to the route's limit as they grow.
        let chunked = try RawConnection(port: server.port)
        let chunk = String(repeating: "b", count: 40_000)
        let body = "9c40\r\n\(chunk)\r\n9c40\r\n\(chunk)\r\n0\r\n\r\n"
        _ = chunked.sendAll("POST /v1/oauth/token HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n" + body)
        #expect(chunked.readResponse()?.status == 413)
        #expect(server.stats().tooLargeRequests == 3)
        expectNoLeaks(server)
    }

    /// A declared body is reserved up to `bodyBytesReservedUpFront` before it arrives and the rest
    /// as it does: slow connections declaring large bodies cannot hold the budget while sending
    /// almost nothing, and an upload that grows past what is left is refused once it ends.
    @Test func aLargeDeclaredBodyHoldsOnlyWhatArrivedPlusTheUpFrontPart() throws {
        let server = try Self.bodyCountingServer(budget: 3_000_000, upFront: 1_000_000)
        defer { server.stop() }

        // Declares 8 MB, sends 100 kB: it holds the up-front 1 MB, not 8.
        let slow = try Self.upload(to: server, declaring: 8_000_000, sending: 100_000)
        #expect(waitUntil(timeout: 10) { server.bufferedBodyBytes == 1_000_000 })
        // So a 1.5 MB request still fits.
        let other = try RawConnection(port: server.port)
        #expect(other.sendAll(post(bodySize: 1_500_000, path: "/v1/messages")))
        #expect(other.readResponse()?.text == "1500000")
        // Its reservation goes back when the request completes, just after the answer is out.
        #expect(waitUntil(timeout: 10) { server.bufferedBodyBytes == 1_000_000 })

        // Past its up-front part it holds what arrived.
        #expect(slow.sendAll([UInt8](repeating: 0x61, count: 2_000_000)))
        #expect(waitUntil(timeout: 10) { server.bufferedBodyBytes == 2_100_000 })
        // 0.95 MB more does not fit (2.1 + 0.95 > 3): refused before its body is read.
        let refused = try Self.upload(to: server, declaring: 950_000)
        #expect(refused.readResponse()?.status == 529)

        // The slow upload itself outgrows the budget: refused once its body has ended.
        #expect(slow.sendAll([UInt8](repeating: 0x61, count: 5_900_000)))
        #expect(slow.readResponse()?.status == 529)
        #expect(server.stats().overloadedRequests == 2)
        expectNoLeaks(server)
    }

    /// A POST to /v1/messages declaring `declared` body bytes, of which `sending` are sent.
    static func upload(to server: HTTPServer, declaring declared: Int, sending: Int = 0) throws -> RawConnection {
        let connection = try RawConnection(port: server.port)
        #expect(connection.sendAll("POST /v1/messages HTTP/1.1\r\nHost: a\r\nContent-Length: \(declared)\r\n\r\n"))
        if sending > 0 { #expect(connection.sendAll([UInt8](repeating: 0x61, count: sending))) }
        return connection
    }

    /// Answers each request with its body's length; bodies up to 10 MB, `budget` held at once.
    static func bodyCountingServer(budget: Int, upFront: Int = 1 << 20) throws -> HTTPServer {
        var config = loopbackConfig()
        config.maxBodyBytes = 10_000_000
        config.maxBufferedBodyBytes = budget
        config.bodyBytesReservedUpFront = upFront
        config.overloadedResponse = { path in
            .json(529, #"{"type":"error","error":{"type":"overloaded_error","message":"busy: \#(path)"}}"#)
        }
        return try startServer(config) { request in
            HTTPResponse(status: 200, body: Array("\(request.body.count)".utf8))
        }
    }

    @Test func globalBodyBudgetAnswersTheOverloadedResponseAndIsReleased() throws {
        let server = try Self.bodyCountingServer(budget: 1_000_000)
        defer { server.stop() }

        // A slow upload holds 800 kB of the 1 MB budget.
        let slow = try Self.upload(to: server, declaring: 800_000, sending: 400_000)
        #expect(waitUntil(timeout: 8) { server.bufferedBodyBytes == 800_000 })

        // Another 300 kB does not fit: the configured answer, without reading the body.
        let refused = try Self.upload(to: server, declaring: 300_000)
        let overloaded = try #require(refused.readResponse())
        #expect(overloaded.status == 529)
        #expect(overloaded.text == #"{"type":"error","error":{"type":"overloaded_error","message":"busy: /v1/messages"}}"#)

        // A chunked upload that grows past what is left is refused once it ends.
        let chunked = try RawConnection(port: server.port)
        let piece = String(repeating: "c", count: 150_000)
        _ = chunked.sendAll("POST /v1/messages HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                            + "249f0\r\n\(piece)\r\n249f0\r\n\(piece)\r\n0\r\n\r\n")
        #expect(chunked.readResponse()?.status == 529)

        // The slow upload completes; its reservation is released and the next request fits.
        #expect(slow.sendAll([UInt8](repeating: 0x61, count: 400_000)))
        #expect(slow.readResponse()?.text == "800000")
        #expect(waitUntil(timeout: 8) { server.bufferedBodyBytes == 0 })
        let after = try RawConnection(port: server.port)
        #expect(after.sendAll(post(bodySize: 300_000, path: "/v1/messages")))
        #expect(after.readResponse()?.text == "300000")
        #expect(server.stats().overloadedRequests == 2)
        // Its 300 kB go back just after its answer is out, not before: the next upload (900 kB)
        // would not fit beside them, so it waits for the release (without this wait it was
        // refused with 529 about once in 100 runs, and the reservation below never appeared).
        #expect(waitUntil(timeout: 8) { server.bufferedBodyBytes == 0 })

        // A request that dies mid-body gives its reservation back too.
        let dying = try Self.upload(to: server, declaring: 900_000, sending: 3)
        #expect(waitUntil(timeout: 8) { server.bufferedBodyBytes == 900_000 })
        #expect(server.stats().overloadedRequests == 2, "the 900-kB upload fits once the budget is empty")
        dying.disconnect()
        expectNoLeaks(server)
    }
}
}

/// A client that hangs up mid-body must give its share of the body budget back at once, however
/// its last bytes and its FIN reach the server.
@Suite struct ClientGoneMidBodyTests {
    /// The loop is held while the client sends its head, part of its body and its FIN, so
    /// libmicrohttpd gets all three from one epoll edge: the case its edge-triggered reads miss
    /// (it takes a short read for a drained socket and never reads the end of file). Without the
    /// server's own check the request waits for the rest of its body until a deadline, holding
    /// its reservation; 200 rounds in a row.
    @Test func aHangUpThatArrivesWithTheLastBytesReleasesTheReservation() throws {
        let loops = try EventLoopGroup(loops: 1, name: "held-loop")
        defer { loops.shutdown() }
        var config = loopbackConfig()
        config.threads = 1
        config.maxBodyBytes = 10_000_000
        config.maxBufferedBodyBytes = 10_000_000
        let server = HTTPServer(configuration: config, loops: loops) { request, _ in
            .response(HTTPResponse(status: 200, body: Array("\(request.body.count)".utf8)))
        }
        try server.start()
        defer { server.stop() }
        let loop = loops.loops[0]
        for round in 0..<200 {
            // The head is read on its own (the request holds its up-front reservation)...
            let client = try RawConnection(port: server.port)
            #expect(client.sendAll("POST /v1/messages HTTP/1.1\r\nHost: a\r\nContent-Length: 900000\r\n\r\n"))
            guard waitUntil(timeout: 10, { server.bufferedBodyBytes == 900_000 }) else {
                Issue.record("round \(round): the head was not read")
                break
            }
            // ...then a few body bytes and the FIN reach it while the loop is busy.
            let held = DispatchSemaphore(value: 0), holding = DispatchSemaphore(value: 0)
            loop.execute {
                holding.signal()
                held.wait()
            }
            holding.wait()
            #expect(client.sendAll(String(repeating: "a", count: 1 + round % 5)))
            client.disconnect()
            held.signal()
            let released = waitUntil(timeout: 10) { server.liveRequestContexts == 0 && server.bufferedBodyBytes == 0 }
            #expect(released, "round \(round): \(server.liveRequestContexts) live requests, \(server.bufferedBodyBytes) bytes reserved")
            if !released { break }
        }
        #expect(server.stats().reaped[.clientClosed] ?? 0 > 0)
        // A request whose client stays keeps its reservation until its body arrives.
        let staying = try RawConnection(port: server.port)
        #expect(staying.sendAll("POST /v1/messages HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nab"))
        #expect(waitUntil(timeout: 10) { server.bufferedBodyBytes == 5 })
        #expect(staying.sendAll("cde"))
        #expect(staying.readResponse()?.text == "5")
        expectNoLeaks(server)
    }
}
